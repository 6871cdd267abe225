"""Opening a store from where it lives: a file path, or a URL whose scheme names the database."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from server.relay.store.protocol import Store
from server.relay.store.sql.database import Database
from server.relay.store.sqlite import SQLiteStore
from server.relay.store.sqlite.connection import Connection as SQLiteConnection

if TYPE_CHECKING:
    from server.relay.store.postgresql.store import SessionHold

SCHEMES = ("sqlite", "postgresql")  # what a location's URL may start with (``scheme://``); a plain path is SQLite's
POSTGRESQL = ("postgresql", "postgres")  # (libpq takes both)


class UnsupportedStore(ValueError):
    """A location no store here can open."""


class StoreUnavailable(Exception):
    """A database server that could not be reached or opened (its own error's text, never the URL's password)."""


class StoreInUse(ValueError):
    """A new session asked for a database that holds another session's state."""


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


@contextlib.contextmanager
def unreachable_as_unavailable() -> Iterator[None]:
    """A database server that cannot be reached or opened, said as ``StoreUnavailable`` (psycopg's reason, which
    never holds the URL's password)."""
    import psycopg

    try:
        yield
    except psycopg.OperationalError as error:
        raise StoreUnavailable(f"the PostgreSQL store could not be opened: {error}") from None


def is_server(location: str | Path) -> bool:
    """Whether ``location`` names a database server (``postgresql://...``) rather than a SQLite file."""
    return isinstance(location, str) and location.partition("://")[0].lower() in POSTGRESQL and "://" in location


def open_store(location: str | Path, *, clock: Callable[[], float] = time.time, durable: bool = True) -> Store:
    """The store at ``location``, opened (created when new): a SQLite file (a path or ``sqlite:///PATH``) or a
    PostgreSQL database (``postgresql://...``, libpq's URL). ``clock`` is what "now" is for it (a simulator runs a
    virtual one); ``durable=False`` lets a SQLite file skip syncing to disk (a simulation's throwaway file)."""
    if is_server(location):
        from server.relay.store.postgresql import PostgreSQLStore  # (psycopg only where a session asks for it)

        with unreachable_as_unavailable():
            return PostgreSQLStore(str(location), clock=clock)
    return SQLiteStore(sqlite_path(location), clock=clock, durable=durable)


def open_database(location: str | Path) -> Database | None:
    """The SQL database under the store at ``location``, opened, for a reader of its tables after the relay stopped
    (a bench's own figures); None for a SQLite file that does not exist."""
    if is_server(location):
        from server.relay.store.postgresql.connection import Connection as PostgreSQLConnection

        database: Database = PostgreSQLConnection(str(location))
    else:
        path = sqlite_path(location)
        if not path.exists():
            return None
        database = SQLiteConnection(path, durable=False)
    database.open()
    return database


def hold_server_session(location: str) -> SessionHold | None:
    """A hold on the session in the database server at ``location`` (not taken yet: ``SessionHold.take``); None for
    a SQLite file, which one relay opens at a time anyway."""
    if not is_server(location):
        return None
    from server.relay.store.postgresql.store import SessionHold

    with unreachable_as_unavailable():
        return SessionHold(location)


def erase_server_store(location: str) -> bool:
    """``serve --fresh`` on a database server: drop the session's tables (a SQLite file goes with its session
    folder). False for a location that is not a server."""
    if not is_server(location):
        return False
    from server.relay.store.postgresql.store import drop_tables

    drop_tables(location)
    return True


def server_holds_a_session(location: str) -> bool:
    """Whether the database server at ``location`` already holds a session's state (False for a SQLite file)."""
    if not is_server(location):
        return False
    from server.relay.store.postgresql.store import holds_a_session

    return holds_a_session(location)


def archive_server_store(location: str) -> str | None:
    """A new session replaces the old on a database server: the old tables move to a schema of their own; returns
    its name (None for a SQLite file, which moves with the session folder's files)."""
    if not is_server(location):
        return None
    from server.relay.store.postgresql.store import archive_tables

    return archive_tables(location)
