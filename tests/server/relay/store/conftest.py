"""The ``store`` fixture every store test takes: one store per implementation, on a virtual clock. A second
implementation runs every test here by adding its name to ``LOCATIONS``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from virtual_clock import Clock

from server.relay.store import Store, open_store

# implementation -> where a test's store lives (the test's own folder); a server-backed store would name a fresh
# database here.
LOCATIONS: dict[str, Callable[[Path], str | Path]] = {
    "sqlite": lambda folder: f"sqlite:///{folder / 'relay.sqlite3'}",
}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=sorted(LOCATIONS))
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Store]:
    opened = open_store(LOCATIONS[request.param](tmp_path), clock=clock)
    try:
        yield opened
    finally:
        opened.close()
