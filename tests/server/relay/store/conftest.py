"""The ``store`` fixture every store test takes: one store per implementation, on a virtual clock: a SQLite file in
the test's folder, and a fresh database on the tests' PostgreSQL server (tests/conftest.py; skipped, saying why,
where PostgreSQL is not installed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from virtual_clock import Clock

from server.relay.store import Store, open_store

# implementation -> where a test's store lives, from the test's request and its own folder
LOCATIONS: dict[str, Callable[[pytest.FixtureRequest, Path], str | Path]] = {
    "sqlite": lambda request, folder: f"sqlite:///{folder / 'relay.sqlite3'}",
    "postgresql": lambda request, folder: request.getfixturevalue("postgresql_url"),
}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=sorted(LOCATIONS))
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Store]:
    opened = open_store(LOCATIONS[request.param](request, tmp_path), clock=clock)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def second_look(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Callable[[], Store]]:
    """Opens another store on the database of this test's ``store`` (what a restarted relay would read), each call
    a new one; all are closed at the end."""
    opened: list[Store] = []

    def look() -> Store:
        opened.append(open_store(LOCATIONS[request.node.callspec.params["store"]](request, tmp_path), clock=clock))
        return opened[-1]
    try:
        yield look
    finally:
        for each in opened:
            each.close()
