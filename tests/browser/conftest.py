"""Browser tests: a real relay process and Debian's headless Chromium driven by pytest-playwright."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.chromium import launch_options

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    return {**browser_type_launch_args, **launch_options()}


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def start_relay(*extra_args: str, log_name: str = "relay.log", env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``peertrain serve --port 0`` and return the process and the URL it printed.

    Output goes to a log file under tests/artifacts (kept for CI), never to an undrained pipe.
    """
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log_path = ARTIFACTS / log_name
    command = [sys.executable, "-m", "server.cli", "serve", "--port", "0", *extra_args]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        match = re.search(r"(http://\S+/)", log_path.read_text())
        if match:
            return process, match.group(1)
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"relay did not print its URL (exit code {process.poll()}): {log_path.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def relay_url() -> Iterator[str]:
    """A relay serving the page and assets only (no session): for tests of the runtime in the worker."""
    process, url = start_relay("--no-session")
    yield url
    process.terminate()
    process.wait(timeout=10)
