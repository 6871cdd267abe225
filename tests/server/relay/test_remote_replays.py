"""Replays on verification workers (``serve --remote-replays``, ``peertrain verify-worker --store URL``): the relay
replays nothing itself; real worker processes claim the replays from the store (PostgreSQL here, as on several
machines); a worker that dies holding a claim loses no check, and a flipped result is caught all the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from relay_fixtures import HttpPeer, flipped, make_relay, serving, session_status, wait_until, work_until_done

from server.relay.remote_replays import StoreReplays
from server.relay.store import open_store
from server.session.package import Package

REPO_ROOT = Path(__file__).resolve().parents[3]
WORKER_SECONDS = 120  # (a bound on each worker process; the test stops them sooner)


def start_worker(url: str, log: Path, *more: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # (the child keeps its own handle)
        return subprocess.Popen([sys.executable, "-m", "server.cli", "verify-worker", "--store", url, *more],
                                cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=30)


def test_a_worker_replays_what_the_relay_queues_and_a_dead_workers_claim_goes_to_the_next(
        package: Package, tmp_path: Path, postgresql_url: str) -> None:
    """The attacker's first result is replayed (every result is: --verify-fraction 1) by a worker process, not the
    relay. Its replay is first claimed by a worker that dies before it finishes (a claim of 1 s that nobody
    finishes, made through the store as any worker makes it); once that claim runs out the running worker takes it,
    the flipped result fails its replay and its peer is banned; the honest peer's results all pass."""
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, store=postgresql_url, remote_replays=True,
                       verify_fraction=1.0, replay_wait="all")
    verifier = relay.verification.queue.verifier if relay.verification.queue is not None else None
    assert verifier is not None and isinstance(verifier.replays, StoreReplays) and verifier.workers == 0
    dying = open_store(postgresql_url)
    worker, log = None, tmp_path / "worker.log"
    try:
        with serving(relay) as client:
            attacker, honest = HttpPeer(client), HttpPeer(client)
            job = attacker.assignment()
            claimed = dying.claim_replay_job("a worker that dies", 1.0)  # (its replay was queued at the hand-out)
            assert claimed is not None and json.loads(claimed.job)["slot"] == job["slot"]
            assert attacker.upload(job["round"], job["slot"], flipped(attacker, job, relay)).status_code == 200
            worker = start_worker(postgresql_url, log, "--claim-seconds", "30")
            status = wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1, timeout=WORKER_SECONDS)
            assert status["counters"]["verification_failed"] == 1
            work_until_done(client, [honest], hold=1.0)
            status = session_status(client)
            authors = {r.peer_id for r in relay.store.all_results()}
        assert status["done"] and status["counters"].get("replays_failed_on_host", 0) == 0
        counters = status["counters"]
        # One replay a unit (the honest peer's result of the attacker's slot is judged by the same replay)
        assert counters["replays_queued_for_workers"] == package.data.num_units
        assert counters["results_verified"] == package.data.num_units  # every honest result, by the worker
        assert authors == {honest.peer_id}
    finally:
        if worker is not None:
            stop(worker)
        dying.close()
    lines = log.read_text().splitlines()
    assert sum(" replayed in " in line for line in lines) == counters["replays_queued_for_workers"], lines
    assert f"round 0 slot {job['slot']} replayed" in log.read_text()


def test_a_worker_killed_mid_session_loses_no_check(package: Package, tmp_path: Path, postgresql_url: str) -> None:
    """A real worker is SIGKILLed after its first replay (with whatever it holds then); a second worker, started
    after, does the rest, its claims running out first where need be: every result of the session is replayed and
    passes, and the session ends."""
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, store=postgresql_url, remote_replays=True,
                       verify_fraction=1.0, replay_wait="all")
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start_worker(postgresql_url, first_log, "--claim-seconds", "2")
    second = None
    try:
        with serving(relay) as client:
            a, b = HttpPeer(client), HttpPeer(client)
            for peer in (a, b):
                job = peer.assignment()
                assert peer.train_and_upload(job).status_code == 200
            deadline = time.monotonic() + WORKER_SECONDS
            while " replayed in " not in first_log.read_text() and time.monotonic() < deadline:
                assert first.poll() is None, first_log.read_text()
                time.sleep(0.02)
            first.kill()  # (SIGKILL: it says nothing, finishes nothing)
            first.wait(timeout=30)
            second = start_worker(postgresql_url, second_log, "--claim-seconds", "30")
            work_until_done(client, [a, b], hold=1.0)
            status = session_status(client)
        assert status["done"] and status["counters"]["results_verified"] == package.data.num_units
        assert status["counters"].get("verification_failed", 0) == 0
        assert status["counters"].get("peers_banned", 0) == 0
    finally:
        first.kill()
        first.wait(timeout=30)
        if second is not None:
            stop(second)
    # The logs are a lower bound on who replayed what: a worker writes its result to the store, then its line, and a
    # fast replay done while the test saw the line before can be stored with its line never written (the SIGKILL
    # between the two; a loaded fresh clone saw 1 + 2 lines for 4 verified results). The store's count is the one
    # above; here, the first worker did one before its kill, and the second every replay of the round after it (k).
    by_first = first_log.read_text().count(" replayed in ")
    by_second = second_log.read_text().count(" replayed in ")
    assert by_first >= 1 and by_second >= 2, (by_first, by_second)


def test_a_round_waiting_for_workers_says_so(package: Package, tmp_path: Path, postgresql_url: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """No worker running: the round's results wait for their replays in the store, and the status says where the
    host starts what they need (a host who forgot the workers saw only "the host is replaying"). The relay then
    closes at once, its merge left to the next start (it held the shutdown for 30 s, waiting for the workers)."""
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, store=postgresql_url, remote_replays=True,
                       verify_fraction=1.0, replay_wait="all")
    with serving(relay) as client:
        for peer in (HttpPeer(client), HttpPeer(client)):
            assert peer.train_and_upload().status_code == 200
        status = session_status(client)
    waiting = status["waiting"]
    assert status["round"] == 0 and waiting == ("round 1: 2 results wait for their replays by verification workers "
                                                "(2 queued in the store; each `peertrain verify-worker --store URL` "
                                                "takes one at a time)"), waiting
    assert "a merge still ran" not in capsys.readouterr().out
