"""What ``peertrain bench chaos`` (``server.bench.chaos``) runs against: a real ``peertrain serve`` on a fixed port
that can be killed and started again, and native peers that do what the browser's worker does and retry
through every refused connection and 5xx; the killer reads what they are doing from ``Uploads``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from runtime.peer import Peer
from server.paths import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
HOLD_SECONDS = 2.0  # peers hold their work requests briefly: a killed relay's held requests fail fast


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RelayProcess:
    """``peertrain serve`` in a child process on a fixed port, so a restart keeps the peers' URL."""

    def __init__(self, arguments: list[str], port: int, log: Path) -> None:
        self.command = [sys.executable, "-m", "server.cli", "serve", *arguments]
        self.env = os.environ | {"PYTHONPATH": os.pathsep.join([str(EXAMPLES), str(REPO_ROOT)])}
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> float:
        """Start and wait until the API answers; returns the seconds it took."""
        started = time.monotonic()
        with self.log.open("a") as log:
            self.process = subprocess.Popen(self.command, cwd=REPO_ROOT, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT)
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"the relay exited with {self.process.returncode}; see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/api/session", timeout=2).status_code == 200:
                    return time.monotonic() - started
            time.sleep(0.05)
        raise TimeoutError(f"the relay did not answer within {timeout_s:.0f} s; see {self.log}")

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


class Down(Exception):
    """The relay does not answer (killed, restarting) or answered 5xx: try again."""


@dataclass
class Uploads:
    """What the peers are doing, for the killer: uploads in flight, and what came back."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    service_unavailable: list[str] = field(default_factory=list)  # the reasons of 503 answers

    def note(self, status: str) -> None:
        with self.lock:
            self.by_status[status] += 1


class RetryingPeer(threading.Thread):
    """The browser worker's loop, natively, retrying every request while the relay is down or answers 5xx."""

    def __init__(self, url: str, uploads: Uploads, stop: threading.Event, deadline: float) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=url, timeout=30)
        self.uploads, self.stop, self.deadline = uploads, stop, deadline
        self.headers: dict[str, str] = {}
        self.error: BaseException | None = None
        self.rejoins = 0

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.client.request(method, path, headers=self.headers, **kwargs)
        except httpx.TransportError as error:
            raise Down(str(error)) from error
        if response.status_code >= 500:
            if response.status_code == 503:
                with contextlib.suppress(ValueError):
                    self.uploads.service_unavailable.append(str(response.json().get("error")))
            raise Down(f"HTTP {response.status_code}")
        return response

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as error:  # reported by the bench
            self.error = error
        finally:
            self.client.close()

    def loop(self) -> None:
        peer: Peer | None = None
        delay = 0.05
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            try:
                if not self.headers:
                    joined = self.call("POST", "/api/join", json={}).json()
                    self.headers = {"Authorization": f"Bearer {joined['peer_id']}:{joined['token']}"}
                if peer is None:
                    peer = Peer(self.call("GET", "/api/task").json())
                response = self.call("POST", f"/api/work?hold={HOLD_SECONDS}")
                if response.status_code == 401:  # (tokens live in SQLite: a restart keeps them)
                    self.headers, self.rejoins = {}, self.rejoins + 1
                    continue
                job = response.json()
                delay = 0.05
                if job.get("done"):
                    return
                if "wait" in job:
                    time.sleep(min(float(job["wait"]), 0.2))
                    continue
                if peer.weights_round != job["weights_round"]:
                    weights = self.call("GET", f"/api/weights?round={job['weights_round']}")
                    if weights.status_code != 200:
                        continue
                    peer.set_weights(weights.content)
                unit = self.call("GET", f"/api/unit/{job['unit_index']}") if job.get("kind") == "data" else None
                if unit is not None and unit.status_code != 200:
                    continue
                body = peer.train(job, unit.content if unit is not None else None)
                with self.uploads.lock:
                    self.uploads.in_flight += 1
                try:
                    answer = self.call("POST", f"/api/result?round={job['round']}&slot={job['slot']}", content=body)
                finally:
                    with self.uploads.lock:
                        self.uploads.in_flight -= 1
                self.uploads.note("accepted" if answer.status_code == 200 else
                                  f"{answer.status_code} {answer.json().get('error', '')}")
            except Down:
                time.sleep(delay)
                delay = min(2 * delay, 0.5)
