"""``peertrain bench capacity`` on a real relay: every figure measured, the events each watcher got counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from relay_fixtures import REPO_ROOT


@pytest.mark.slow
def test_a_small_capacity_run_measures_downloads_and_watchers(tmp_path: Path) -> None:
    out = tmp_path / "capacity.json"
    command = [sys.executable, "-m", "server.cli", "bench", "capacity", "--downloads", "10", "--watchers", "4",
               "--changes", "3", "--chunks", "2", "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert figures["weights_bytes"] > 1 << 20 and figures["download_cpu_ms"] >= 0  # (the bytetext model's weights)
    # each watcher's opening status and one event per change at least (changes are waited for, not coalesced)
    assert figures["events"] >= 4 * (1 + 3) and figures["watcher_change_cpu_ms"] >= 0
    assert "anchor: the relay idle uses" in done.stdout and "ms of relay CPU per event" in done.stdout
