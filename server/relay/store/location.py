"""Opening a store from where it lives: a file path, or a URL whose scheme names the database."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from server.relay.store.protocol import Store
from server.relay.store.sqlite import SQLiteStore

SCHEMES = ("sqlite",)  # what a location's URL may start with (``scheme://``); a plain path is SQLite's


class UnsupportedStore(ValueError):
    """A location no store here can open."""


def sqlite_path(location: str | Path) -> Path:
    """The file of a SQLite location: a path, or ``sqlite:///PATH`` (SQLAlchemy's form: ``sqlite:///runs/a.db`` is
    relative, ``sqlite:////srv/a.db`` absolute)."""
    if isinstance(location, Path) or "://" not in location:
        return Path(location)
    scheme, _, rest = location.partition("://")
    if scheme.lower() not in SCHEMES:
        supported = ", ".join(f"{name}:///PATH" for name in SCHEMES)
        raise UnsupportedStore(f"no store opens {scheme}:// locations; supported: a file path, {supported}")
    if not rest.startswith("/") or rest == "/":  # (a host, or nothing: sqlite://host/a.db, sqlite:///)
        raise UnsupportedStore("a SQLite location is a file path or sqlite:///PATH (three slashes, no host)")
    return Path(rest[1:])


def open_store(location: str | Path, *, clock: Callable[[], float] = time.time, durable: bool = True) -> Store:
    """The store at ``location``, opened (created when new). ``clock`` is what "now" is for it (a simulator runs a
    virtual one); ``durable=False`` lets it skip syncing to disk (a simulation's throwaway file)."""
    return SQLiteStore(sqlite_path(location), clock=clock, durable=durable)
