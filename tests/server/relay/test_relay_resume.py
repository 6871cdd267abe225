"""A relay killed mid-session resumes from its checkpoint and SQLite file and ends where an uninterrupted run ends.

The end-to-end test runs ``peertrain serve`` as a subprocess with native peers in threads (httpx, training with
``runtime.peer.Peer``), SIGKILLs it after the first result of a round was accepted, restarts it on the same
session folder and lets the peers reconnect on their own.

The task is the majority example imported as a module (``majority_task:MajorityTask`` with ``examples/`` on
PYTHONPATH) rather than as ``examples/majority_task.py``: for a task file, ``serve`` rebuilds the shared
``wheels/`` folder for browsers at every start, which these native peers do not need.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import numpy as np
import pytest
from relay_fixtures import (
    ADMIN_TOKEN,
    EXAMPLE,
    HttpPeer,
    build_small_package,
    make_relay,
    reference_run,
    serving,
    session_status,
    wait_for_round,
)
from relay_process import ADMIN, PeerThread, Relayd, UploadGate, free_port, retrying, retrying_fails
from starlette.testclient import TestClient

from server.relay.app import RelayPaths, create_app
from server.relay.state import Relay
from server.relay.store import open_store
from server.session import checkpoint_files as checkpoint
from server.session.export import exported_weights
from server.session.package import Package
from server.session.session import Session, SessionConfig


def test_restart_after_the_last_result_but_before_the_merge_merges(tmp_path: Path) -> None:
    """A relay killed between storing a round's last result and merging it must merge on restart."""
    package = build_small_package(tmp_path / "package")
    session_dir = tmp_path / "session"
    relay = make_relay(package, session_dir, k=2, passes=1)
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        job_a, job_b = a.assignment(), b.assignment()
        assert a.train_and_upload(job_a).status_code == 200
        # The last result reaches SQLite, then the process dies before the merge task runs.
        relay.mode.accept(b.peer_id, 0, job_b["slot"], b.train(job_b))
        assert relay.session.round == 0
    restarted = Relay(session=Session.restore(session_dir, package), package=package,
                      store=open_store(session_dir / "relay.sqlite3"), options=relay.options)
    assert restarted.session.round == 0
    with serving(restarted) as client:
        a.client = b.client = client
        assert "wait" in a.work()  # nothing left to hand out; this poll starts the merge
        status = wait_for_round(client, 1, timeout=10)
        assert status["round"] == 1 and status["history"][-1]["participants"] == 2
        assert a.assignment()["round"] == 1


def test_the_hosts_pause_outlives_a_restart(tmp_path: Path) -> None:
    """The host paused; the relay restarts on the same store and checkpoints: still paused (it hands out nothing and
    says so) until the host resumes."""
    package = build_small_package(tmp_path / "package")
    session_dir = tmp_path / "session"
    relay = make_relay(package, session_dir, k=2, passes=1)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with serving(relay) as client:
        assert client.post("/api/admin/pause", headers=admin).json()["paused"] is True
    restarted = Relay(session=Session.restore(session_dir, package), package=package,
                      store=open_store(session_dir / "relay.sqlite3"), options=relay.options)
    with serving(restarted) as client:
        peer = HttpPeer(client)
        assert peer.work()["reason"] == "paused" and session_status(client)["paused"] is True
        assert client.post("/api/admin/resume", headers=admin).json()["paused"] is False
        assert peer.assignment()["round"] == 0


def test_the_shutdown_waits_for_the_merge_in_flight_to_write_its_checkpoint(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The app shuts down while a merge runs in its worker thread: the relay closes its store and metrics log only
    once that merge has written its checkpoint (before, the thread went on against a closed store and log)."""
    package = build_small_package(tmp_path / "package")
    relay = make_relay(package, tmp_path / "session", k=2, passes=1)
    told: list[str] = []
    relay.session.round_log = cast(Any, SimpleNamespace(begin=lambda *_, **__: told.append("begin"),
                                                        follow=lambda _: told.append("follow"),
                                                        close=lambda: told.append("close")))
    started, release, holding = threading.Event(), threading.Event(), threading.Event()
    merge = relay.mode.merge_blocking

    def held_merge() -> dict[str, Any]:
        started.set()
        release.wait(timeout=120)  # (bounded: the test releases it)
        return merge()
    monkeypatch.setattr(relay.mode, "merge_blocking", held_merge)
    hold_for_close = relay.merges.hold_for_close

    async def noted_hold(seconds: float) -> bool:
        holding.set()
        return await hold_for_close(seconds)
    monkeypatch.setattr(relay.merges, "hold_for_close", noted_hold)
    client = TestClient(create_app(RelayPaths(), relay))
    client.__enter__()
    peers = [HttpPeer(client), HttpPeer(client)]
    for peer, job in [(peer, peer.assignment()) for peer in peers]:
        assert peer.train_and_upload(job).status_code == 200
    assert started.wait(timeout=60)  # the merge runs in its thread
    closing = threading.Thread(target=client.__exit__, args=(None, None, None))
    closing.start()
    assert holding.wait(timeout=60)  # the shutdown has begun, and waits
    assert not relay.store.closed and "close" not in told
    release.set()
    closing.join(timeout=120)
    assert not closing.is_alive() and relay.store.closed
    assert told == ["follow", "close"]  # (the merged round reached the log before it closed; nothing after)
    assert Session.restore(tmp_path / "session", package).round == 1


# ---------------------------------------------------------------- SIGKILL and restart of `peertrain serve`


@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_relay_killed_mid_round_resumes_and_matches_an_uninterrupted_run(tmp_path: Path, store: str,
                                                                         request: pytest.FixtureRequest,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on either store: SQLite in the session folder, or ``serve --store postgresql://...``."""
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # the peers import majority_task as the browsers would
    session_dir, log = tmp_path / "session", tmp_path / "serve.log"
    location = request.getfixturevalue("postgresql_url") if store == "postgresql" else None
    relayd = Relayd(session_dir, free_port(), log, store=location)
    deadline = time.monotonic() + 120
    gate = UploadGate(limit=5)  # rounds 0 and 1 (2 results each), then the first result of round 2
    peers = [PeerThread(relayd.url, gate, deadline) for _ in range(2)]
    observer = httpx.Client(base_url=relayd.url, timeout=30)
    try:
        relayd.start()
        for peer in peers:
            peer.start()
        gate.wait_for_held(timeout=60)  # the other peer trained round 2's second unit
        status = retrying(observer, "GET", "/api/session", deadline).json()
        assert status["round"] == 2 and status["round_progress"]["done"] == 1, status

        relayd.kill()
        assert retrying_fails(observer)
        relayd.start()
        status = retrying(observer, "GET", "/api/session", deadline).json()
        assert status["round"] == 2 and status["round_progress"]["done"] == 1, status  # checkpoint + SQLite
        assert status["peers"]["joined"] == 2 and status["counters"]["leases_released_on_start"] == 1
        gate.open()
        for peer in peers:
            peer.join(timeout=max(1.0, deadline - time.monotonic()))
        for peer in peers:
            assert peer.error is None, f"{peer.error!r}\n{log.read_text()}"

        status = retrying(observer, "GET", "/api/session", deadline).json()
        assert status["done"] and status["round"] == 4 and len(status["history"]) == 4
        model = observer.get("/api/admin/export/model", headers={"Authorization": f"Bearer {ADMIN}"})
        final = exported_weights(model.content)
    finally:
        gate.open()
        observer.close()
        relayd.stop()
    assert "resuming session" in log.read_text()

    refusals = [r for peer in peers for r in peer.refusals]
    assert (401, "unauthorized") not in refusals  # peers live in SQLite: their tokens survive the restart
    # Only the result held across the restart is refused: its lease was released and the unit handed out
    # again. If its round merged before the held upload arrived the refusal is a stale round; if the unit's new
    # holder uploaded first (the merge waits for the host's replays) a duplicate; else not_leased.
    assert len(refusals) == 1 and refusals[0] in {(403, "not_leased"), (409, "stale_round"),
                                                  (409, "duplicate")}, refusals
    accepted = sorted(a for peer in peers for a in peer.accepted)
    assert accepted == [(r, s) for r in range(4) for s in range(2)]

    package = Package.load(session_dir / "package")
    config = SessionConfig.from_json(checkpoint.read_session_config(session_dir)["config"])
    assert np.array_equal(final, reference_run(package, config))
    if location is not None:  # the session's state lived in PostgreSQL, and nowhere else
        assert not (session_dir / "relay.sqlite3").exists()
        kept = open_store(location)
        try:
            assert [(r.round, r.slot) for r in kept.all_results()] == accepted and kept.peer_count() == 2
        finally:
            kept.close()
