"""Browser tests: a real relay process and Debian's headless Chromium driven by pytest-playwright."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from server.browser.chromium import launch_options
from server.browser.launcher import launch_relay
from server.relay.client import RelayClient

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    return {**browser_type_launch_args, **launch_options()}


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def start_relay(*extra_args: str, log_name: str = "relay.log") -> tuple[subprocess.Popen, str]:
    """Start ``peertrain serve --port 0`` logging into tests/artifacts (kept for CI); the process and its URL.
    Every result message is kept unless the test says otherwise: these tests replay whole sessions natively."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    keep = () if "--keep-results" in extra_args or "--no-session" in extra_args else ("--keep-results", "all")
    return launch_relay(*extra_args, *keep, log_path=ARTIFACTS / log_name)


def session_status(url: str) -> dict:
    """The relay's ``/api/session`` status, through the relay's Python client."""
    with httpx.Client(base_url=url, timeout=10) as http:
        return RelayClient(http).status()


def wait_until_done(page: Page, url: str, *, timeout_s: float) -> dict:
    """Poll the session until it is done (or the time is up); returns the last status."""
    deadline = time.monotonic() + timeout_s
    status = session_status(url)
    while not status["done"] and time.monotonic() < deadline:
        page.wait_for_timeout(1000)  # (not time.sleep: Playwright delivers page events during its own calls)
        status = session_status(url)
    return status


@pytest.fixture(scope="session")
def relay_url() -> Iterator[str]:
    """A relay serving the page and assets only (no session): for tests of the runtime in the worker."""
    process, url = start_relay("--no-session")
    yield url
    process.terminate()
    process.wait(timeout=10)
