"""Browser tests: a real relay process and Debian's headless Chromium driven by pytest-playwright."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_helpers import ARTIFACTS, start_relay

from server.browser.chromium import launch_options
from server.harness.serve_command import ServeCommand


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    return {**browser_type_launch_args, **launch_options()}


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def relay_url() -> Iterator[str]:
    """A relay serving the page and assets only (no session): for tests of the runtime in the worker."""
    process, url = start_relay(ServeCommand(no_session=True))
    yield url
    process.terminate()
    process.wait(timeout=10)
