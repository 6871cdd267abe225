"""The one Python client of the relay's HTTP API: join, work (with hold), weights, unit, result, status.

Each endpoint is described once as a ``Call`` (method, path, body); ``RelayClient`` sends calls over any
client with httpx's interface (``httpx.Client``, or Starlette's ``TestClient`` in-process) and
``AsyncRelayClient`` over ``httpx.AsyncClient``. Both keep the peer's credentials after ``join`` and raise
``RelayRefusal`` (the relay's ``{"error", "message"}`` and status) for a 4xx or 5xx answer. ``send`` returns
the raw response for callers that examine refusals themselves (the relay's tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from runtime.protocol import Joined, Receipt

if TYPE_CHECKING:
    from server.relay.volunteer_key import VolunteerKey


class RelayRefusal(Exception):
    """The relay refused a request: ``status`` (HTTP), ``code`` (the relay's reason), its message and the ``ticket``
    a refused join is given (``""`` otherwise)."""

    def __init__(self, status: int, code: str, message: str, ticket: str = "") -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.ticket = status, code, message, ticket


def checked(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        raise RelayRefusal(response.status_code, str(body.get("error", "http_error")),
                           str(body.get("message", response.text[:200])), str(body.get("ticket", "")))
    return response


def json_object(response: httpx.Response) -> dict[str, Any]:
    return dict(checked(response).json())


def content(response: httpx.Response) -> bytes:
    return checked(response).content


@dataclass(frozen=True)
class Call:
    """One request to the relay and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], Any] = json_object
    json: Any = None
    content: bytes | None = None
    authorized: bool = True
    follow_redirects: bool = False


def join_call(join_code: str | None = None, ticket: str = "", engine_class: str = "",
              volunteer: dict[str, Any] | None = None) -> Call:
    """``POST /api/join``; ``ticket``: the one the last ``429 join_rate`` gave, which keeps the join's place;
    ``engine_class``: what the peer trains on (``runtime.peer.engine_class``); ``volunteer``: the proof of a
    volunteer key (``VolunteerKey.proof``)."""
    body = ({"join_code": join_code} if join_code else {}) | ({"ticket": ticket} if ticket else {}) | (
        {"engine_class": engine_class} if engine_class else {}) | ({"volunteer": volunteer} if volunteer else {})
    return Call("POST", "/api/join", json=body, authorized=False)


def challenge_call() -> Call:
    """``POST /api/challenge``: what the next join signs with its volunteer key."""
    return Call("POST", "/api/challenge", authorized=False)


def task_call() -> Call:
    return Call("GET", "/api/task", authorized=False)


def status_call() -> Call:
    return Call("GET", "/api/session", authorized=False)


def work_call(hold: float | str | None = None, *, back: bool = False) -> Call:
    query = "&".join(([] if hold is None else [f"hold={hold}"]) + (["back=1"] if back else []))
    return Call("POST", f"/api/work?{query}" if query else "/api/work")


def leave_call() -> Call:
    """The peer is going: its leases are released at once (``POST /api/leave``)."""
    return Call("POST", "/api/leave")


def weights_call(version: int | None = None) -> Call:
    """The current weights, or (``version``) the version a job names (async mode keeps recent ones)."""
    return Call("GET", "/api/weights" if version is None else f"/api/weights?round={version}", parse=content)


def named_weights_call(digest: str, held: str | None = None) -> Call:
    """The weights a job names (``weights_digest``): with ``held``, the chain of steps from the weights held (or,
    redirected, the full weights when the relay has no chain). Content-addressed: sent without credentials."""
    return Call("GET", f"/api/weights/{digest}" + (f"/from/{held}" if held else ""), parse=content,
                authorized=False, follow_redirects=True)


def unit_call(index: int) -> Call:
    return Call("GET", f"/api/unit/{index}", parse=content)


def result_call(round_index: int | str, slot: int | str, body: bytes) -> Call:
    return Call("POST", f"/api/result?round={round_index}&slot={slot}", content=body)


@dataclass
class Credentials:
    peer_id: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.peer_id}:{self.token}"}


@dataclass
class RelayClient:
    """Synchronous calls over ``http`` (whose base URL is the relay's)."""

    http: Any  # httpx.Client or starlette.testclient.TestClient
    credentials: Credentials | None = field(default=None)

    def send(self, call: Call, *, headers: dict[str, str] | None = None) -> httpx.Response:
        """The raw response to ``call`` (``headers`` replace the peer's credentials when given)."""
        if headers is None:
            headers = self.credentials.headers if call.authorized and self.credentials else {}
        response: httpx.Response = self.http.request(call.method, call.path, headers=headers, json=call.json,
                                                     content=call.content, follow_redirects=call.follow_redirects)
        return response

    def call(self, call: Call) -> Any:
        return call.parse(self.send(call))

    def join(self, join_code: str | None = None, engine_class: str = "",
             volunteer: VolunteerKey | None = None) -> Credentials:
        proof = volunteer.proof(self.call(challenge_call())["challenge"]) if volunteer is not None else None
        joined = Joined.from_json(self.call(join_call(join_code, engine_class=engine_class, volunteer=proof)))
        self.credentials = Credentials(joined.peer_id, joined.token)
        return self.credentials

    def task(self) -> dict[str, Any]:
        return dict(self.call(task_call()))

    def status(self) -> dict[str, Any]:
        return dict(self.call(status_call()))

    def work(self, hold: float | str | None = None, *, back: bool = False) -> dict[str, Any]:
        """The answer's JSON as it came (the relay's tests read and tamper with its fields; a peer reads it with
        ``runtime.protocol.work_answer_from_json``); ``back``: the first ask after this peer's own leave."""
        return dict(self.call(work_call(hold, back=back)))

    def leave(self) -> dict[str, Any]:
        return dict(self.call(leave_call()))

    def weights(self, version: int | None = None) -> bytes:
        return bytes(self.call(weights_call(version)))

    def unit(self, index: int) -> bytes:
        return bytes(self.call(unit_call(index)))

    def result(self, round_index: int, slot: int, body: bytes) -> Receipt:
        return Receipt.from_json(self.call(result_call(round_index, slot, body)))


@dataclass
class AsyncRelayClient:
    """The same calls over ``httpx.AsyncClient`` (many simulated peers on one event loop)."""

    http: httpx.AsyncClient
    credentials: Credentials | None = field(default=None)

    async def send(self, call: Call) -> httpx.Response:
        headers = self.credentials.headers if call.authorized and self.credentials else {}
        return await self.http.request(call.method, call.path, headers=headers, json=call.json, content=call.content,
                                       follow_redirects=call.follow_redirects)

    async def call(self, call: Call) -> Any:
        return call.parse(await self.send(call))

    async def join(self, join_code: str | None = None, engine_class: str = "") -> Credentials:
        joined = Joined.from_json(await self.call(join_call(join_code, engine_class=engine_class)))
        self.credentials = Credentials(joined.peer_id, joined.token)
        return self.credentials
