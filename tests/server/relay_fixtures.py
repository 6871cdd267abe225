"""Helpers for the relay tests: a small package, a relay with its app, and native peers that talk HTTP.

A ``HttpPeer`` does what the browser's worker does, through the relay's Python client over any client
with httpx's interface (Starlette's ``TestClient`` in-process, or ``httpx.Client`` against a
``peertrain serve`` subprocess): join, ask for work, fetch the weights and the unit's chunk, train with
``runtime.peer.Peer`` (the module a browser runs) and upload the result message.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from starlette.testclient import TestClient

from runtime import wire
from runtime.peer import Peer
from runtime.tasks import UnitResult
from server.relay.app import RelayPaths, create_app
from server.relay.client import RelayClient, result_call
from server.relay.options import RelayOptions
from server.relay.state import Relay
from server.relay.store import Store, StoredResult, open_store
from server.relay.volunteer_key import VolunteerKey
from server.session.buffered import Arrival
from server.session.buffered import replay as buffered_replay
from server.session.package import Package, build_package
from server.session.session import Session, SessionConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "majority_task.py"
# 4 chunks of 256 rows, 2 local epochs: a unit trains in milliseconds and still learns the majority.
SMALL_SETTINGS: dict[str, Any] = {"chunks": 4, "examples": 1024, "epochs": 2}
ADMIN_TOKEN = "admin-secret"


def build_small_package(directory: Path, task: str | Path = EXAMPLE, **settings: Any) -> Package:
    return build_package(str(task), SMALL_SETTINGS | settings, Path(directory), seed=0, log=lambda _: None)


def build_text_package(folder: Path, chunks: int) -> Package:
    """A tiny bytetext package on a pangram text (2 Adam steps of 4 windows a unit): the real byte-level task, small."""
    text = folder / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.\n" * 200)
    settings = {"files": [str(text)], "chunks": chunks, "steps": 2, "batch_size": 4, "validation_windows": 8}
    return build_package("bytetext", settings, folder / "package", log=lambda _: None)


def make_relay(package: Package, session_dir: Path | None, *, k: int = 2, passes: int = 2,
               config: dict[str, Any] | None = None, store: str | None = None, **options: Any) -> Relay:
    """A fresh session on ``package`` (checkpoints in ``session_dir`` when given) behind a relay; ``config``:
    more session settings (``aggregate``, ...), ``options``: relay options. Backups of slow units are off
    unless ``backup_after`` is given: these tests script who trains what (tests/server/relay/test_backups.py). Every
    result message is kept unless ``keep_results`` is given: these tests replay whole sessions. Replays run natively
    unless ``replay_engine`` is given (these peers train natively; a Pyodide worker boots in seconds, and the tests of
    the browser's engine ask for it: tests/server/relay/test_pyodide_replays.py). ``store``: where the store lives
    (a PostgreSQL URL), else a SQLite file in ``session_dir``."""
    session = Session.create(package, SessionConfig(participants=k, passes=passes, **(config or {})),
                             directory=session_dir)
    store_path = (session_dir or Path(package.path).parent) / "relay.sqlite3"
    defaults = {"backup_after": None, "keep_results": None, "replay_engine": "native"}
    return Relay(session=session, package=package, store=open_store(store or store_path),
                 options=RelayOptions(admin_token=ADMIN_TOKEN, **(defaults | options)))


@contextmanager
def serving(relay: Relay) -> Iterator[TestClient]:
    """The app on one event loop for the whole block (the merge runs as a background task on it)."""
    try:
        with TestClient(create_app(RelayPaths(), relay)) as client:
            yield client
    finally:
        relay.store.close()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class PausedHistory(list[Any]):
    """A session's history whose first append (a merge, in its worker thread, between taking the merged weights
    and counting the round: ``Session._advance``) waits for the test."""

    def __init__(self, entries: list[Any]) -> None:
        super().__init__(entries)
        self.entered, self.go = threading.Event(), threading.Event()

    def append(self, entry: Any) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(30), "the test never let the merge go on"
        super().append(entry)


class HttpPeer(RelayClient):
    """A native peer speaking the relay's HTTP API (``server.relay.client``) through ``client`` (TestClient or
    httpx.Client): joined at once, with the task built as a browser builds it."""

    def __init__(self, client: httpx.Client, *, join_code: str | None = None, engine_class: str = "",
                 volunteer: VolunteerKey | None = None) -> None:
        super().__init__(client)
        credentials = self.join(join_code, engine_class, volunteer=volunteer)
        self.peer_id: str = credentials.peer_id
        self.token: str = credentials.token
        self.peer = Peer(self.task())

    @property
    def client(self) -> httpx.Client:
        """The HTTP client this peer speaks through (a test may point it at a restarted relay)."""
        return self.http  # type: ignore[no-any-return]

    @client.setter
    def client(self, client: httpx.Client) -> None:
        self.http = client

    @property
    def headers(self) -> dict[str, str]:
        assert self.credentials is not None
        return self.credentials.headers

    def assignment(self) -> dict[str, Any]:
        """The next assignment; fails the test when the relay says wait or done instead."""
        job = self.work()
        assert "slot" in job, f"expected an assignment, got {job}"
        return job

    def train(self, job: dict[str, Any]) -> bytes:
        """Fetch the round's weights and the unit's chunk (data tasks), train natively, return the result message."""
        named = job.get("weights_digest")  # (a ban's undo changes a round's weights: the job names the new ones)
        if self.peer.weights_round != job["round"] or (named and self.peer.weights_sha != named):
            self.peer.set_weights(self.weights(job["round"]))
        return self.peer.train(job, self.unit(job["unit_index"]) if job.get("kind", "data") == "data" else None)

    def upload(self, round_index: int | str, slot: int | str, body: bytes,
               headers: dict[str, str] | None = None) -> httpx.Response:
        """The raw answer to a result upload (tests examine refusals); ``headers`` replace the peer's own."""
        return self.send(result_call(round_index, slot, body), headers=headers)

    def train_and_upload(self, job: dict[str, Any] | None = None) -> httpx.Response:
        job = job or self.assignment()
        return self.upload(job["round"], job["slot"], self.train(job))


def ask_and_send(peer: HttpPeer, ask: httpx.Client, send: httpx.Client) -> tuple[dict[str, Any], bytes] | None:
    """``peer`` asks ``ask`` for work, trains and sends its result to ``send`` (relays serving one session together),
    which must accept it: (the job, the result sent), or None when it was not handed a unit. The peer speaks to
    ``ask`` again afterwards."""
    peer.client = ask
    job = peer.work()
    if "slot" not in job:
        return None
    body = peer.train(job)
    peer.client = send
    answer = peer.upload(job["round"], job["slot"], body)
    assert answer.status_code == 200, (answer.text, job)
    peer.client = ask
    return job, body


def session_status(client: httpx.Client) -> dict[str, Any]:
    return RelayClient(client).status()


def wait_for_round(client: httpx.Client, round_index: int, timeout: float = 30.0) -> dict[str, Any]:
    """Poll ``/api/session`` until ``round_index`` rounds are merged (or the session is done)."""
    deadline = time.monotonic() + timeout
    while True:
        status = session_status(client)
        if (status["round"] >= round_index or status["done"]) and not status["merging"]:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"round {round_index} not reached in {timeout} s: {status}")
        time.sleep(0.02)


def run_round(client: httpx.Client, peers: list[HttpPeer]) -> dict[str, Any]:
    """Each peer trains one assignment of the current round; waits for the merge."""
    start = session_status(client)["round"]
    jobs = [(peer, peer.assignment()) for peer in peers]
    for peer, job in jobs:
        response = peer.train_and_upload(job)
        assert response.status_code == 200, response.text
    return wait_for_round(client, start + 1)


def wait_until(client: httpx.Client, predicate: Callable[[dict[str, Any]], bool],
               timeout: float = 20.0) -> dict[str, Any]:
    """Poll ``/api/session`` until ``predicate`` holds; fails with the counters when ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        status = session_status(client)
        if predicate(status) or time.monotonic() > deadline:
            assert predicate(status), status["counters"]
            return status
        time.sleep(0.02)


IDLE_HOLD_SECONDS = 5.0  # ``work_until_done``: an ask after a turn without work waits this long for work at most


def work_until_done(client: httpx.Client, peers: list[HttpPeer], limit: int = 200, hold: float | None = None) -> None:
    """The peers take turns asking for work and uploading honest results until the session is done (at most
    ``limit`` turns each); ``hold``: each ask waits up to that many seconds for work (``POST /api/work?hold=S``: a
    round waiting for slow replays is then waited on, not asked ``limit`` times at once). Each turn starts one peer
    later than the last: a peer always asking last would find every round taken whenever the merge is slower than
    the others' asks (it did, in a loaded run), and a test that expects every peer to train would fail. After a turn
    in which no peer got work (a merge or a replay runs), the next turn's first ask holds (``IDLE_HOLD_SECONDS``),
    answered as work appears: on a loaded host 200 turns of asks answered "wait" at once ran out while one merge
    ran."""
    idle = False
    for turn in range(limit):
        if session_status(client)["done"]:
            return
        first, worked = turn % len(peers), False
        for n, peer in enumerate(peers[first:] + peers[:first]):
            job = peer.work(hold if hold is not None or not (idle and n == 0) else IDLE_HOLD_SECONDS)
            if "slot" in job:
                worked = True
                response = peer.train_and_upload(job)
                assert response.status_code == 200, (response.json(), job, peer.peer_id)
        idle = not worked
    raise AssertionError(f"the session did not finish: {session_status(client)}")


def flipped(peer: HttpPeer, job: dict[str, Any], relay: Relay) -> bytes:
    """``peer``'s result for ``job`` turned against the global weights: global - 2 * (result - global), sent as the
    session takes results (float32 weights, or an update in its codec, as an attacker speaking the API would)."""
    from server.bench.attack_peers import as_upload, result_weights

    g = relay.session.weights
    codec = relay.session.config.result_codec
    header, trained = result_weights(peer.train(job), g, codec)
    return as_upload((g - 2 * (trained - g)).astype(np.float32), header, g, codec, job["unit_seed"])


def replay(package: Package, config: SessionConfig, results: list[StoredResult]) -> Session:
    """A fresh in-process session fed the recorded results round by round (slot order, as the relay merges)."""
    session = Session.create(package, config)
    by_round: dict[int, list[StoredResult]] = {}
    for result in results:
        by_round.setdefault(result.round, []).append(result)
    for round_index in sorted(by_round):
        assert round_index == session.round
        by_slot = {a.slot: a for a in session.assignments()}
        pairs = []
        for stored in by_round[round_index]:
            _, vector = wire.decode(stored.message, expect_spec=session.spec)
            pairs.append((by_slot[stored.slot], UnitResult(vector, stored.num_examples, stored.metrics)))
        session.complete_round(pairs, carry_missing=True)  # (as the relay: a unit missed by a deadline moves on)
    return session


def reference_run(package: Package, config: SessionConfig) -> np.ndarray:
    """The final weights of the same session with every unit trained in-process (no relay, no HTTP)."""
    from server.simulation.uploads import SimulatedUploads

    session, uploads = Session.create(package, config), SimulatedUploads()  # (results through the session's codec)
    while not session.done:
        session.complete_round([(a, uploads.arrived(session, a, package.task.train_unit(session.weights,
                                                                                        session.work_unit(a))))
                                for a in session.assignments()])
    return session.weights


def recorded_results(location: str | Path) -> list[StoredResult]:
    """Every result the store at ``location`` kept (a synchronous session's), read once; the store is closed again."""
    opened = open_store(location)
    try:
        return opened.all_results()
    finally:
        opened.close()


def recorded_arrivals(store: Store | str | Path) -> list[Arrival]:
    """The asynchronous buffer's arrivals as the store recorded them (each message decoded); a location is opened
    and closed again."""
    opened = open_store(store) if isinstance(store, str | Path) else store
    try:
        return [Arrival(seq, entry, unit, version, merge, examples, metrics, wire.decode(message)[1])
                for seq, entry, unit, version, merge, examples, metrics, message in opened.arrivals()]
    finally:
        if opened is not store:
            opened.close()


def replayed_arrivals(package: Package, config: SessionConfig, arrivals: list[Arrival]) -> np.ndarray:
    """The weights a fresh in-process session reaches fed the recorded arrivals (``server.session.buffered``)."""
    return buffered_replay(Session.create(package, config), arrivals, exponent=config.staleness_exponent,
                           validate_every=config.validate_every).weights
