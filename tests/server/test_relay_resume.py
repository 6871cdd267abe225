"""A relay killed mid-session resumes from its checkpoint and SQLite file and ends where an uninterrupted run ends.

The end-to-end test runs ``peertrain serve`` as a subprocess with native peers in threads (httpx, training with
``runtime.peer.Peer``), SIGKILLs it after the first result of a round was accepted, restarts it on the same
session folder and lets the peers reconnect on their own.

The task is the majority example imported as a module (``majority_task:MajorityTask`` with ``examples/`` on
PYTHONPATH) rather than as ``examples/majority_task.py``: for a task file, ``serve`` rebuilds the shared
``wheels/`` folder for browsers at every start, which these native peers do not need.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from relay_fixtures import (
    EXAMPLE,
    REPO_ROOT,
    SMALL_SETTINGS,
    HttpPeer,
    build_small_package,
    make_relay,
    reference_run,
    serving,
    wait_for_round,
)

from runtime.peer import Peer
from server.relay.app import RelayPaths
from server.relay.sqlite_store import Store
from server.relay.state import Relay
from server.session import checkpoint_files as checkpoint
from server.session.export import exported_weights
from server.session.package import Package
from server.session.session import Session, SessionConfig

ADMIN = "resume-admin"


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
        relay.accept_result(b.peer_id, 0, job_b["slot"], b.train(job_b))
        assert relay.session.round == 0
    restarted = Relay(session=Session.restore(session_dir, package), package=package,
                      store=Store(session_dir / "relay.sqlite3"), options=relay.options)
    assert restarted.session.round == 0
    with serving(restarted) as client:
        a.client = b.client = client
        assert "wait" in a.work()  # nothing left to hand out; this poll starts the merge
        status = wait_for_round(client, 1, timeout=10)
        assert status["round"] == 1 and status["history"][-1]["participants"] == 2
        assert a.assignment()["round"] == 1


# ---------------------------------------------------------------- SIGKILL and restart of `peertrain serve`


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Relayd:
    """``peertrain serve`` in a subprocess on a fixed port, so restarts keep the peers' URL."""

    def __init__(self, session_dir: Path, port: int, log: Path, *more: str) -> None:
        self.command = [sys.executable, "-m", "server.cli", "serve", "--port", str(port),
                        "--task", "majority_task:MajorityTask", "--session-dir", str(session_dir),
                        "-k", "2", "--passes", "2", "--admin-token", ADMIN, "--lease-seconds", "5",
                        "--no-backups", *more]  # (the test counts the leases a restart releases)
        for key, value in SMALL_SETTINGS.items():
            self.command += ["--set", f"{key}={value}"]
        self.env = os.environ | {"PYTHONPATH": str(EXAMPLE.parent)}
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(self.command, cwd=REPO_ROOT, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def retrying(client: httpx.Client, method: str, path: str, deadline: float, **kwargs: Any) -> httpx.Response:
    """One request, retried with back-off while the relay is down (connection refused or reset)."""
    delay = 0.05
    while True:
        try:
            return client.request(method, path, **kwargs)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.5)


class UploadGate:
    """Lets ``limit`` results be accepted, then holds every upload until ``open()``."""

    def __init__(self, limit: int) -> None:
        self.limit, self.accepted, self.held, self.opened = limit, 0, 0, False
        self.condition = threading.Condition()

    def upload(self, send: Any) -> httpx.Response:
        with self.condition:
            while not self.opened and self.accepted >= self.limit:
                self.held += 1
                self.condition.notify_all()
                self.condition.wait()
                self.held -= 1
            response: httpx.Response = send()
            self.accepted += response.status_code == 200
            self.condition.notify_all()
            return response

    def wait_for_held(self, timeout: float) -> None:
        """Until ``limit`` results are in and a peer holds a trained result at the gate."""
        with self.condition:
            assert self.condition.wait_for(lambda: self.accepted >= self.limit and self.held, timeout), self.accepted

    def open(self) -> None:
        with self.condition:
            self.opened = True
            self.condition.notify_all()


class PeerThread(threading.Thread):
    """The browser worker's loop, natively: join once, then work / weights / unit / train / upload."""

    def __init__(self, url: str, gate: UploadGate, deadline: float) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=url, timeout=30)
        self.gate, self.deadline = gate, deadline
        self.refusals: list[tuple[int, str]] = []  # (status, code) of every 4xx this peer got
        self.accepted: list[tuple[int, int]] = []
        self.error: BaseException | None = None

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = retrying(self.client, method, path, self.deadline, headers=self.headers, **kwargs)
        if response.status_code >= 400:
            self.refusals.append((response.status_code, response.json().get("error", "")))
        return response

    def run(self) -> None:
        try:
            self.headers: dict[str, str] = {}
            joined = self.call("POST", "/api/join", json={}).json()
            self.headers = {"Authorization": f"Bearer {joined['peer_id']}:{joined['token']}"}
            self.peer_id = joined["peer_id"]
            peer = Peer(self.call("GET", "/api/task").json())
            while time.monotonic() < self.deadline:
                job = self.call("POST", "/api/work").json()
                if job.get("done"):
                    return
                if "wait" in job:
                    time.sleep(min(float(job["wait"]), 0.1))
                    continue
                if peer.weights_round != job["round"]:
                    peer.set_weights(self.call("GET", f"/api/weights?round={job['round']}").content)
                unit = self.call("GET", f"/api/unit/{job['unit_index']}")
                if unit.status_code != 200:
                    continue
                body = peer.train(job, unit.content)
                query = f"/api/result?round={job['round']}&slot={job['slot']}"
                response = self.gate.upload(functools.partial(self.call, "POST", query, content=body))
                if response.status_code == 200:
                    self.accepted.append((job["round"], job["slot"]))
            raise TimeoutError("the session did not finish in time")
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            self.client.close()


@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
def test_relay_killed_mid_round_resumes_and_matches_an_uninterrupted_run(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # the peers import majority_task as the browsers would
    session_dir, log = tmp_path / "session", tmp_path / "serve.log"
    relayd = Relayd(session_dir, free_port(), log)
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


def retrying_fails(client: httpx.Client) -> bool:
    """The killed relay no longer answers."""
    try:
        client.get("/api/session", timeout=2)
    except httpx.TransportError:
        return True
    return False
