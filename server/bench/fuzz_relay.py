"""What ``peertrain bench fuzz`` (``server.bench.fuzz``) runs against: a real ``peertrain serve`` on loopback only
(``server.harness.RelayProcess``), a short session of the majority example whose admin token the fuzzer holds."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.options import RelayOptions
from server.session.config import SessionConfig

ADMIN = "fuzz-admin-token"
TASK = "majority_task:MajorityTask"  # examples/ on PYTHONPATH (a task file would rebuild the shared wheels/)
TASK_SETTINGS = {"chunks": 4, "examples": 1024, "epochs": 2}
LOOPBACK = "127.0.0.1"


def serve_command(work_dir: Path) -> ServeCommand:
    """4 chunks, k = 2, two passes; min_peers 1 so that the fuzzer's own peer is handed units, peers timed out
    after a second, no verification so that a result of its that is accepted does not get it banned. It listens
    on loopback only (``--host``: serve's own switch, no setting of the session's, pinned whatever its default)."""
    return ServeCommand(task=TASK, task_settings=TASK_SETTINGS, session_dir=work_dir / "session", fresh=True,
                        config=SessionConfig(participants=2, passes=2),
                        options=RelayOptions(admin_token=ADMIN, min_peers=1, peer_timeout=1.0, verify=False),
                        extra=("--host", LOOPBACK))


@contextmanager
def relay_process(work_dir: Path, *, timeout: float = 120.0) -> Iterator[str]:
    """``peertrain serve`` on 127.0.0.1, port 0, in a child process, its log in ``work_dir``; yields its base URL
    (no trailing slash)."""
    with RelayProcess(serve_command(work_dir), log=work_dir / "serve.log", examples=True,
                      start_timeout_s=timeout) as relay:
        if urlsplit(relay.url).hostname != LOOPBACK:
            raise RuntimeError(f"the fuzzer only targets {LOOPBACK}, the relay printed {relay.url}")
        yield relay.url
