"""Opening a store from where it lives: a file path, or a URL whose scheme names the database."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from server.relay.store.protocol import Store
from server.relay.store.sqlite import SQLiteStore

SCHEMES = ("sqlite", "postgresql")  # what a location's URL may start with (``scheme://``); a plain path is SQLite's
POSTGRESQL = ("postgresql", "postgres")  # (libpq takes both)


class UnsupportedStore(ValueError):
    """A location no store here can open."""


def sqlite_path(location: str | Path) -> Path:
    """The file of a SQLite location: a path, or ``sqlite:///PATH`` (SQLAlchemy's form: ``sqlite:///runs/a.db`` is
    relative, ``sqlite:////srv/a.db`` absolute)."""
    if isinstance(location, Path) or "://" not in location:
        return Path(location)
    scheme, _, rest = location.partition("://")
    if scheme.lower() not in SCHEMES:
        raise UnsupportedStore(f"no store opens {scheme}:// locations; supported: a file path, sqlite:///PATH, "
                               "postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    if not rest.startswith("/") or rest == "/":  # (a host, or nothing: sqlite://host/a.db, sqlite:///)
        raise UnsupportedStore("a SQLite location is a file path or sqlite:///PATH (three slashes, no host)")
    return Path(rest[1:])


def is_server(location: str | Path) -> bool:
    """Whether ``location`` names a database server (``postgresql://...``) rather than a SQLite file."""
    return isinstance(location, str) and location.partition("://")[0].lower() in POSTGRESQL and "://" in location


def open_store(location: str | Path, *, clock: Callable[[], float] = time.time, durable: bool = True) -> Store:
    """The store at ``location``, opened (created when new): a SQLite file (a path or ``sqlite:///PATH``) or a
    PostgreSQL database (``postgresql://...``, libpq's URL). ``clock`` is what "now" is for it (a simulator runs a
    virtual one); ``durable=False`` lets a SQLite file skip syncing to disk (a simulation's throwaway file)."""
    if is_server(location):
        from server.relay.store.postgresql import PostgreSQLStore  # (psycopg only where a session asks for it)

        return PostgreSQLStore(str(location), clock=clock)
    return SQLiteStore(sqlite_path(location), clock=clock, durable=durable)
