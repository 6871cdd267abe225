"""Host replays on the browser's own engine (Pyodide under Node, ``server.browser_assets.engines``), over HTTP.

Peers here train in Pyodide too (``PyodidePeer``: the same engine, a process of its own), so their results are the
replays' bytes: a result one float32 ulp off the replay is banned, where the tolerance of a native replay would let
it through; a result named as trained on another engine is refused on a task whose units part ways across engines;
a worker the host loses mid-replay fails nobody, and a relay that closes leaves no worker behind."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import (
    HttpPeer,
    build_text_package,
    make_relay,
    serving,
    session_status,
    wait_until,
    work_until_done,
)

from runtime import wire
from runtime.protocol import Job, PeerAction, action_after
from server.browser_assets import engines
from server.relay.client import RelayRefusal
from server.relay.state import Relay
from server.session.package import Package

pytestmark = pytest.mark.skipif(engines.pyodide_missing() is not None,
                                reason=f"the browser's engine cannot run here: {engines.pyodide_missing()}")


class PyodidePeer(HttpPeer):
    """A peer that trains in Pyodide under Node (the page's engine) and speaks the relay's HTTP API."""

    def __init__(self, client: Any, engine: engines.PyodideEngine, task_info: dict[str, Any]) -> None:
        super().__init__(client)
        self.engine, self.task_info = engine, task_info

    def train(self, job: dict[str, Any]) -> bytes:
        unit = self.unit(job["unit_index"]) if job.get("kind", "data") == "data" else None
        return self.engine.train(self.task_info, Job.from_json(job), self.weights(job["round"]), unit)


@pytest.fixture(scope="module")
def engine() -> Any:
    worker = engines.PyodideEngine()
    yield worker
    worker.close()


def task_info(package: Package) -> dict[str, Any]:
    return {**package.task_description(), "task_source": package.manifest.get("task_source")}


def audit(relay: Relay) -> list[str]:
    return [row["verification"] or "" for row in relay.store.audit()]


def test_results_from_the_browsers_engine_pass_bit_for_bit_and_one_ulp_off_is_banned(
        package: Package, tmp_path: Path, engine: engines.PyodideEngine) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=2, verify=True, verify_fraction=1.0,
                       replay_engine="pyodide", replay_workers=1)
    with serving(relay) as client:
        booted_worker(relay)
        honest = PyodidePeer(client, engine, task_info(package))
        cheat = PyodidePeer(client, engine, task_info(package))
        job = honest.assignment()
        assert honest.train_and_upload(job).status_code == 200
        job = cheat.assignment()
        message = cheat.train(job)
        header, weights = wire.decode(message)
        nudged = weights.copy()
        nudged[7] = np.nextafter(nudged[7], np.float32(np.inf))  # one ulp of one weight of thousands
        assert cheat.upload(job["round"], job["slot"], wire.encode(nudged, header)).status_code == 200
        status = wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1
                            and s["counters"].get("results_verified", 0) >= 1)
        assert status["counters"]["verification_failed"] == 1
        assert any("identical bits" in row for row in audit(relay))
        banned = relay.store.ban_reason(cheat.peer_id)
        assert banned is not None and "it must be identical" in banned
        assert relay.store.ban_reason(honest.peer_id) is None
        defenses = " ".join(relay.defenses()["guards"])
        assert "browser's own engine (Pyodide)" in defenses and "bit for bit" in defenses


def test_a_session_of_peers_on_the_browsers_engine_ends_with_every_result_identical(
        package: Package, tmp_path: Path, engine: engines.PyodideEngine) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=2, verify=True, verify_fraction=1.0,
                       replay_engine="pyodide")
    with serving(relay) as client:
        work_until_done(client, [PyodidePeer(client, engine, task_info(package)) for _ in range(2)], hold=5)
        status = session_status(client)
        rows = audit(relay)
    assert status["counters"]["results_verified"] == 8 and "peers_banned" not in status["counters"]
    assert sum("identical bits" in row for row in rows) == 8


@pytest.fixture(scope="module")
def text_package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    return build_text_package(tmp_path_factory.mktemp("text"), chunks=4)


def test_bytetext_is_verified_and_a_native_result_is_refused_not_banned(
        text_package: Package, tmp_path: Path, engine: engines.PyodideEngine) -> None:
    """bytetext's units part ways across engines (Adam): the session replays them on the browser's engine, takes
    results from it only, and tells pages to train on the CPU. The native peer is not handed more work to waste
    (the protocol says stop), and while it is the only peer the session says what it needs."""
    relay = make_relay(text_package, tmp_path / "session", k=2, passes=1, config={"codec": "int8"}, verify=True,
                       verify_fraction=1.0, replay_engine="pyodide")
    with serving(relay) as client:
        assert client.get("/api/task").json()["devices"] == ["cpu"]
        native = HttpPeer(client)
        answer = native.train_and_upload()
        assert answer.status_code == 422 and answer.json()["error"] == "engine_not_replayable", answer.json()
        assert action_after(422, answer.json()["error"]) is PeerAction.STOP
        waiting = session_status(client)["waiting"]
        assert waiting == ("round 1: 2 units wait for a peer on pyodide-numpy (a browser page trains on it): the "
                           "connected peers train on native-numpy, whose results this session cannot check bit for "
                           "bit (with --redundancy, peers of one engine class check each other by copies)"), waiting
        with pytest.raises(RelayRefusal) as again:
            native.work()
        assert (again.value.status, again.value.code) == (422, "engine_not_replayable")
        work_until_done(client, [PyodidePeer(client, engine, task_info(text_package)) for _ in range(2)], hold=5)
        status = session_status(client)
        assert relay.store.ban_reason(native.peer_id) is None
    assert status["counters"]["results_verified"] == 4 and "peers_banned" not in status["counters"]


def test_a_replay_the_host_fails_to_run_fails_nobody(package: Package, tmp_path: Path,
                                                      engine: engines.PyodideEngine) -> None:
    """A worker that does not answer in time is killed; the replay is no verdict on the peer (counted), the round
    merges, and the next replay boots a new worker."""
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, verify=True, verify_fraction=1.0,
                       replay_engine="pyodide", replay_workers=1)
    with serving(relay) as client:
        worker = booted_worker(relay)
        worker.job_seconds = 1e-4  # (a worker that hangs, as the host sees it)
        work_until_done(client, [PyodidePeer(client, engine, task_info(package)) for _ in range(2)], hold=5)
        status = session_status(client)
    counters = status["counters"]  # (4 units: every replay failed, none banned anyone)
    assert "peers_banned" not in counters and counters["replays_failed_on_host"] == 4, counters
    assert "results_verified" not in counters and worker.boots >= 2 and worker._process is None


def test_a_lost_worker_is_started_again_and_a_closed_relay_leaves_none(package: Package, tmp_path: Path,
                                                                       engine: engines.PyodideEngine) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, verify=True, verify_fraction=1.0,
                       replay_engine="pyodide", replay_workers=1)
    with serving(relay) as client:
        worker = booted_worker(relay)
        assert worker._process is not None
        popen = worker._process.popen
        os.kill(popen.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while popen.poll() is None:  # (dead before the first replay: that one starts a new worker)
            assert time.monotonic() < deadline
            time.sleep(0.02)
        work_until_done(client, [PyodidePeer(client, engine, task_info(package)) for _ in range(2)], hold=5)
        status = session_status(client)
        assert worker._process is not None
        pid = worker._process.popen.pid
    assert status["counters"]["results_verified"] == 4 and worker.boots == 2
    deadline = time.monotonic() + 30  # the relay closed: its worker exits at the end of its input
    while worker_alive(pid):
        assert time.monotonic() < deadline, f"replay worker {pid} still runs after the relay closed"
        time.sleep(0.05)


def booted_worker(relay: Relay) -> engines.PyodideEngine:
    """The relay's one Pyodide replay worker, once it has booted (bounded)."""
    verifier = relay.verification.queue.verifier if relay.verification.queue is not None else None
    assert verifier is not None
    deadline = time.monotonic() + engines.BOOT_SECONDS
    while time.monotonic() < deadline:
        for worker in list(verifier.replays._engines):
            if isinstance(worker, engines.PyodideEngine) and worker._process is not None and worker._process.boot:
                return worker
        time.sleep(0.05)
    raise AssertionError("the replay worker did not boot")


def worker_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_the_engine_resolves_auto_and_refuses_pyodide_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    assert engines.resolve("auto") == ("pyodide", None) and engines.resolve("native") == ("native", None)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert engines.resolve("auto") == ("native", "node is not on PATH")
    with pytest.raises(ValueError, match="cannot run here: node is not on PATH"):
        engines.resolve("pyodide")
    assert json.dumps(engines.ENGINE_CHOICES)


def test_auto_replays_a_task_from_the_hosts_python_path_natively() -> None:
    """Pyodide cannot import a task module that is neither the runtime's nor a file (no wheel of it exists): auto
    replays it natively, where every Pyodide replay would fail and leave its result unchecked; asked for, pyodide
    stays."""
    module = engines.host_only_task({"task_import": "majority_task:MajorityTask", "task_source": None})
    assert module == "majority_task"
    assert engines.resolve("auto", module) == ("native", "the task module majority_task comes from this machine's "
                                                         "Python path, which Pyodide cannot import")
    assert engines.resolve("pyodide", module) == ("pyodide", None) and engines.resolve("native", module) == (
        "native", None)
    for reached in ({"task_import": "runtime.tasks.arith:ArithTask"},
                    {"task_import": "majority_task:MajorityTask", "task_source": "/x/majority_task.py"}, {}):
        assert engines.host_only_task(reached) is None and engines.resolve("auto", None) == ("pyodide", None)


def test_a_task_from_a_file_is_told_at_set_up_whether_its_units_replay_exactly(package: Package,
                                                                               tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", verify=True, replay_engine="pyodide", replay_workers=1)
    try:
        words = relay.verification.dry_run()
    finally:
        relay.close()
    assert "majority replays exactly on the browser's engine" in words, words
    assert "natively it differs by" in words and "within the native replays' tolerance 0.01" in words, words
    native = make_relay(package, tmp_path / "native", verify=True, replay_engine="native")
    try:
        assert native.verification.dry_run() == "no dry run of the replays: replays run natively (asked for)"
    finally:
        native.close()
