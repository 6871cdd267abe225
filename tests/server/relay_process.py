"""A ``peertrain serve`` subprocess that a test can SIGKILL and restart, and native peers in threads that retry
through its restarts (the browser worker's loop, natively), for the tests that kill a real relay mid-session
(``test_relay_resume.py``, ``test_async.py``).

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
from relay_fixtures import EXAMPLE, REPO_ROOT, SMALL_SETTINGS

from runtime.peer import Peer

ADMIN = "resume-admin"


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


def retrying_fails(client: httpx.Client) -> bool:
    """The killed relay no longer answers."""
    try:
        client.get("/api/session", timeout=2)
    except httpx.TransportError:
        return True
    return False
