"""A ``peertrain serve`` subprocess that a test can SIGKILL and restart, and native peers in threads that retry
through its restarts (the browser worker's loop, natively), for the tests that kill a real relay mid-session
(``test_relay_resume.py``, ``test_async.py``).

The task is the majority example imported as a module (``majority_task:MajorityTask`` with ``examples/`` on
PYTHONPATH) rather than as ``examples/majority_task.py``: for a task file, ``serve`` builds a wheel for browsers
into the session's folder at every start, which these native peers do not need (it warns that no browser can
import the module).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from relay_fixtures import SMALL_SETTINGS

from server.harness.native_peer import NativePeer, PeerHooks, RetryPolicy
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.options import RelayOptions
from server.session.config import SessionConfig

ADMIN = "resume-admin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The session: 2 of the majority example's 4 units a round, two passes; leases of 5 s and no backups (the test
# counts the leases a restart releases).
RELAYD_CONFIG = SessionConfig(participants=2, passes=2)


def relayd_options(**changes: Any) -> RelayOptions:
    return RelayOptions(**{"admin_token": ADMIN, "lease_seconds": 5, "backup_after": None, **changes})


def wait_for(what: str, predicate: Callable[[], Any], deadline: float) -> None:
    """Until ``predicate()`` holds, looking every 50 ms; fails saying ``what`` once ``deadline`` (monotonic) passes."""
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def shared_relay(tmp_path: Path, name: str, *, port: int, session_dir: Path, store: str, config: SessionConfig,
                 options: RelayOptions, start_timeout_s: float) -> RelayProcess:
    """One of several ``serve`` processes over one PostgreSQL store and session folder (the majority example, its
    log ``serve-NAME.log``): the tests of a relay taking a session over, or serving it beside another."""
    return RelayProcess(ServeCommand(task="majority_task:MajorityTask", task_settings=SMALL_SETTINGS,
                                     session_dir=session_dir, store=store, config=config, options=options, port=port),
                        log=tmp_path / f"serve-{name}.log", examples=True, start_timeout_s=start_timeout_s)


def wind_down(gate: UploadGate, peers: list[NativePeer], first: RelayProcess, second: RelayProcess) -> None:
    """A two-relay test's way out, whatever happened: uploads let through, every peer told to stop, the first relay
    killed (it may be already), the second stopped."""
    gate.open()
    for peer in peers:
        peer.stop_event.set()
    first.kill()
    second.stop()


class Relayd(RelayProcess):
    """``peertrain serve`` in a subprocess (``server.harness.RelayProcess``) on a fixed port, so that restarts keep
    the peers' URL and it is known before the first start."""

    def __init__(self, session_dir: Path, port: int, log: Path, *, config: SessionConfig = RELAYD_CONFIG,
                 options: RelayOptions | None = None, store: str | None = None) -> None:
        super().__init__(ServeCommand(task="majority_task:MajorityTask", task_settings=SMALL_SETTINGS,
                                      session_dir=session_dir, store=store, config=config,
                                      options=options or relayd_options(), port=port), log=log, examples=True)
        self.url = f"http://127.0.0.1:{port}"


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


def status_when(client: httpx.Client, predicate: Callable[[dict[str, Any]], bool], deadline: float) -> dict[str, Any]:
    """``/api/session`` once ``predicate`` holds (polled through restarts); fails with the last status at
    ``deadline``."""
    while True:
        status: dict[str, Any] = retrying(client, "GET", "/api/session", deadline).json()
        if predicate(status):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


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


class PeerThread(NativePeer):
    """The browser worker's loop, natively (``server.harness.NativePeer``): join once, then work / weights / unit /
    train / upload, every request sent again while the relay is down, every upload through ``gate``."""

    def __init__(self, url: str, gate: UploadGate, deadline: float) -> None:
        super().__init__(url, hooks=PeerHooks(send_result=lambda job, send: gate.upload(send)), wait_cap_s=0.1,
                         deadline=deadline, retry=RetryPolicy(resend=100_000, retry_5xx=False))

    @property
    def refusals(self) -> list[tuple[int, str]]:
        """(status, code) of every 4xx this peer got."""
        return self.log.refusals

    @property
    def accepted(self) -> list[tuple[int, int]]:
        return self.log.accepted


def retrying_fails(client: httpx.Client) -> bool:
    """The killed relay no longer answers."""
    try:
        client.get("/api/session", timeout=2)
    except httpx.TransportError:
        return True
    return False
