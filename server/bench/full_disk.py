"""A full disk for ``peertrain bench chaos --full-disk``: a small tmpfs holds the session, a filler takes its free
space after a few rounds, and the relay must answer 503 ``disk_full``, keep its last good checkpoint and
resume by itself when the filler is removed (``server.relay.storage``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from server.session import checkpoint_files as checkpoint

Status = Callable[[], "dict[str, Any] | None"]  # the relay's /api/session, None while it does not answer

@contextlib.contextmanager
def small_filesystem(size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MB mounted on a temporary folder (needs root); unmounted afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="peertrain-full-disk-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        folder.rmdir()
        raise PermissionError(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


class DiskFiller:
    """Fills the session's filesystem after ``after_rounds`` rounds, watches the relay refuse with 503 and
    keep its checkpoint, then frees the space and lets the session finish."""

    def __init__(self, session_dir: Path, *, after_rounds: int = 2, full_seconds: float = 4.0) -> None:
        self.session_dir, self.after_rounds, self.full_seconds = session_dir, after_rounds, full_seconds
        self.filler = session_dir.parent / "filler"

    def fill(self) -> None:
        descriptor = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for size in (1 << 16, 1 << 12, 1 << 9, 1):  # down to the last byte: no small write may fit either
                with contextlib.suppress(OSError):
                    while True:
                        os.write(descriptor, bytes(size))
            with contextlib.suppress(OSError):
                os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def run(self, status_of: Status, log: Any) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = status_of()
            if status is not None and status["round"] >= self.after_rounds:
                break
            time.sleep(0.01)
        before = checkpoint.read_latest(self.session_dir)
        before_round = int(before.state["round"])
        self.fill()
        log(f"  disk full after round {before_round} ({self.filler.stat().st_size / 1e6:.1f} MB of filler)")
        time.sleep(self.full_seconds)  # the peers meet the full disk meanwhile (their 503s are counted)
        status = status_of() or {}
        problem = status.get("storage", {}).get("problem")
        kept = checkpoint.read_latest(self.session_dir)
        same = int(kept.state["round"]) >= before_round and kept.weights.shape == before.weights.shape
        log(f"  while full: status says {problem!r}; the latest checkpoint is "
            f"round {kept.state['round']} and reads back: {same}")
        self.filler.unlink()
        freed = time.monotonic()
        while time.monotonic() - freed < 60:
            status = status_of() or {}
            if status.get("round", 0) > int(kept.state["round"]) or status.get("done"):
                break
            time.sleep(0.05)
        resumed = time.monotonic() - freed
        log(f"  space freed: the next round merged {resumed:.2f} s later")
        return {"full_at_round": before_round, "checkpoint_kept": same,
                "problem_reported": problem, "resumed_seconds": resumed}
