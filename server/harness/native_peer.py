"""A native peer: the browser worker's loop (``web/src/worker.js``) in Python, for benches and tests.

It speaks the documented API through the relay's Python client (``server.relay.client.RelayClient``) and trains
with ``runtime.peer.Peer``, the module a browser's worker runs: join, then ``work -> weights -> unit -> train ->
result`` until the relay says the session is done, at most ``max_steps`` requests for work and ``timeout_s``
seconds (past either, ``error`` is a TimeoutError). Hooks change what it does:

* ``PeerHooks.upload(job, honest) -> bytes``: the bytes uploaded instead of the honest result (attackers);
* ``PeerHooks.train(job, weights) -> bytes``: skip the unit and the training, upload these bytes;
* ``PeerHooks.send_result(job, send) -> Response``: wraps each upload (a gate that holds uploads, an in-flight count);
* ``PeerHooks.on_answer(response)``: sees every answer (tallies of 503 reasons);
* ``PeerHooks.stop() -> bool`` and the ``stop`` event: stop conditions, looked at before every step.

``RetryPolicy`` says what a request that got no answer (connection refused or dropped) or a 5xx does: sent again
up to ``resend`` times, then, up to ``restarts`` times, the loop starts over from asking for work (what the
browser's worker does after an error), with a doubling delay between tries; past both, ``error`` says why.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from runtime import wire
from runtime.deltas import is_chain
from runtime.peer import Peer
from server.relay.client import (
    Call,
    Credentials,
    RelayClient,
    RelayRefusal,
    checked,
    join_call,
    named_weights_call,
    result_call,
    task_call,
    unit_call,
    weights_call,
    work_call,
)

Job = dict[str, Any]
JOIN_RETRY_S = 1.0  # after a 429 on join (the relay's join rate is 2 a second per address by default)


class Unanswered(Exception):
    """A request got no answer (connection refused, reset, timed out) or a 5xx, and the retry policy gave up."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of a request that got no answer or (with ``retry_5xx``) a 5xx."""

    resend: int = 0  # times the same request is sent again
    restarts: int = 0  # times the loop then starts over from asking for work
    retry_5xx: bool = True
    first_delay_s: float = 0.05
    max_delay_s: float = 0.5

    def delay(self, tries: int) -> float:
        """The pause after the ``tries``-th failed try (counting from 0): doubling, at most ``max_delay_s``."""
        return min(self.first_delay_s * 2.0 ** min(tries, 60), self.max_delay_s)


@dataclass
class PeerHooks:
    upload: Callable[[Job, bytes], bytes] | None = None
    train: Callable[[Job, bytes], bytes] | None = None
    send_result: Callable[[Job, Callable[[], httpx.Response]], httpx.Response] | None = None
    on_answer: Callable[[httpx.Response], None] | None = None
    stop: Callable[[], bool] | None = None


@dataclass
class PeerLog:
    """What the peer saw."""

    refusals: list[tuple[int, str]] = field(default_factory=list)  # (status, code) of every 4xx/5xx kept
    accepted: list[tuple[int, int]] = field(default_factory=list)  # (round, slot) of every accepted upload
    results: Counter[str] = field(default_factory=Counter)  # "accepted", "403 not_leased", ...
    trained: int = 0
    uploads_skipped_training: int = 0
    rejoins: int = 0
    unanswered: int = 0  # requests given up on (each a resend or a restart followed)
    weights_bytes: int = 0  # bytes of weights received (full messages and chains of steps)
    join_waits: int = 0  # joins refused 429 (join_rate, too_many_peers) and tried again
    chains: int = 0  # weights rebuilt from a chain of steps


class NativePeer:
    """One native peer of the relay at ``url``; ``run()`` in this thread, or ``start()`` in a thread of its own."""

    def __init__(self, url: str, *, hooks: PeerHooks | None = None, retry: RetryPolicy | None = None,
                 hold_s: float | None = None, wait_cap_s: float = 0.2, max_steps: int = 100_000,
                 timeout_s: float = 600.0, deadline: float | None = None, request_timeout_s: float = 30.0,
                 join_code: str | None = None, headers: dict[str, str] | None = None,
                 stop: threading.Event | None = None, verify: ssl.SSLContext | bool = True) -> None:
        self.hooks, self.retry = hooks or PeerHooks(), retry or RetryPolicy()
        self.hold_s, self.wait_cap_s, self.max_steps = hold_s, wait_cap_s, max_steps
        self.deadline = deadline if deadline is not None else time.monotonic() + timeout_s
        self.join_code = join_code
        self.http = httpx.Client(base_url=url, timeout=request_timeout_s, headers=headers, verify=verify)
        self.relay = RelayClient(self.http)
        self.stop_event = stop or threading.Event()
        self.log = PeerLog()
        self.peer: Peer | None = None
        self.weights_message = b""
        self._held: int | str | None = None  # the digest (or, from a relay that names none, the version) held
        self.ended = ""  # "done", "stopped", or why it gave up
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    @property
    def peer_id(self) -> str | None:
        return self.relay.credentials.peer_id if self.relay.credentials else None

    # -- threads -----------------------------------------------------------------------------------
    def start(self) -> NativePeer:
        self.thread = threading.Thread(target=self.run_catching, daemon=True)
        self.thread.start()
        return self

    def run_catching(self) -> None:
        try:
            self.run()
        except BaseException as error:  # reported by the caller (``error``)
            self.error = error
        finally:
            self.close()

    def close(self) -> None:
        self.http.close()

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    # -- requests ----------------------------------------------------------------------------------
    def stopping(self) -> bool:
        return self.stop_event.is_set() or (self.hooks.stop is not None and self.hooks.stop())

    def pause(self, seconds: float) -> None:
        self.stop_event.wait(max(0.0, min(seconds, self.deadline - time.monotonic())))

    def send(self, call: Call) -> httpx.Response:
        """The answer to ``call``, sent again per the retry policy; raises ``Unanswered``."""
        for tries in range(self.retry.resend + 1):
            try:
                response = self.relay.send(call)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
            else:
                if self.hooks.on_answer is not None:
                    self.hooks.on_answer(response)
                if response.status_code < 500 or not self.retry.retry_5xx:
                    return response
                problem = f"HTTP {response.status_code}"
            delay = self.retry.delay(tries)
            if tries == self.retry.resend or self.stopping() or time.monotonic() + delay > self.deadline:
                break
            self.pause(delay)
        self.log.unanswered += 1
        raise Unanswered(f"{call.method} {call.path}: {problem}")

    def call(self, call: Call) -> Any:
        """``call``'s parsed answer; a refusal (4xx, or a 5xx not retried) is kept in the log and raised."""
        response = self.send(call)
        try:
            return call.parse(response)
        except RelayRefusal as refusal:
            self.log.refusals.append((refusal.status, refusal.code))
            raise

    def sign_in(self) -> None:
        joined = self.call(join_call(self.join_code))
        self.relay.credentials = Credentials(joined["peer_id"], joined["token"])

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> str:
        """Until the session is done or a stop condition holds; returns ``ended``. Raises TimeoutError past the
        step or time bound, ``Unanswered`` when the retry policy gave up."""
        restarts = 0  # since the last step that went through
        for _ in range(self.max_steps):
            if self.stopping():
                self.ended = "stopped"
                return self.ended
            if time.monotonic() > self.deadline:
                break
            try:
                if self.step():
                    self.ended = "done"
                    return self.ended
            except Unanswered:
                if restarts >= self.retry.restarts or self.stopping():
                    raise
                self.pause(self.retry.delay(restarts))
                restarts += 1
            else:
                restarts = 0  # (a step went through: the delays start over)
        self.ended = "timeout"
        raise TimeoutError(f"the session was not done after {self.max_steps} steps or at the peer's deadline")

    def step(self) -> bool:
        """One ``work -> weights -> unit -> train -> result``; True when the relay says the session is done."""
        if self.relay.credentials is None:
            try:
                self.sign_in()
            except RelayRefusal as refusal:  # too many joins from this address at once: wait, as a page does
                if refusal.status != 429:
                    raise
                self.log.join_waits += 1
                self.pause(JOIN_RETRY_S)
                return False
        if self.peer is None and self.hooks.train is None:
            self.peer = Peer(self.call(task_call()))
        try:
            job = self.call(work_call(self.hold_s))
        except RelayRefusal as refusal:
            if refusal.status == 401:  # a token the relay no longer knows (a new session): join again
                self.relay.credentials, self.log.rejoins = None, self.log.rejoins + 1
                return False
            raise
        if job.get("done"):
            return True
        if "wait" in job:
            self.pause(min(float(job["wait"]), self.wait_cap_s))
            return False
        try:
            body = self.trained(job)
        except RelayRefusal:
            return False  # (kept in the log) the lease went meanwhile, or a version no longer kept: ask again
        self.upload(job, body)
        return False

    def weights(self, job: Job) -> bytes:
        """The weights message the job names, fetched when the one held is other weights. A peer that trains and
        holds earlier weights asks for the chain of steps from them (``runtime.deltas``): ``weights_message`` is then
        that chain; one that does not rebuild the named weights is dropped for the full message."""
        digest = job.get("weights_digest")
        wanted = digest or int(job["weights_round"])
        if self._held != wanted or not self.weights_message:
            if digest is None:
                message = self.call(weights_call(int(job["weights_round"])))
            else:
                message = self.call(named_weights_call(digest, self.peer.weights_sha if self.peer else None))
            self.log.weights_bytes += len(message)
            if self.peer is not None:
                try:
                    self.peer.set_weights(message)
                    self.log.chains += is_chain(message)
                except wire.WireError:
                    if not is_chain(message):
                        raise
                    message = self.call(named_weights_call(str(digest)))
                    self.log.weights_bytes += len(message)
                    self.peer.set_weights(message)
            self.weights_message, self._held = message, wanted
        return self.weights_message

    def trained(self, job: Job) -> bytes:
        weights = self.weights(job)
        if self.hooks.train is not None:
            self.log.uploads_skipped_training += 1
            return self.hooks.train(job, weights)
        assert self.peer is not None
        unit = self.call(unit_call(int(job["unit_index"]))) if job.get("kind", "data") == "data" else None
        body = self.peer.train(job, unit)
        self.log.trained += 1
        return self.hooks.upload(job, body) if self.hooks.upload is not None else body

    def upload(self, job: Job, body: bytes) -> None:
        call = result_call(job["round"], job["slot"], body)

        def send() -> httpx.Response:
            return self.send(call)

        response = self.hooks.send_result(job, send) if self.hooks.send_result is not None else send()
        try:
            checked(response)
        except RelayRefusal as refusal:
            self.log.refusals.append((refusal.status, refusal.code))
            self.log.results[f"{refusal.status} {refusal.code}"] += 1
            return
        self.log.results["accepted"] += 1
        self.log.accepted.append((int(job["round"]), int(job["slot"])))
