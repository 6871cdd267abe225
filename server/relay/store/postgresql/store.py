"""``PostgreSQLStore``: the relay's store in a PostgreSQL database (``serve --store postgresql://...``), and what
a host does to a whole database: ask whether it holds a session, archive one, erase one.

One database holds one session (its tables in the connection's schema, ``public`` unless the URL says otherwise):
a new session starts on empty tables, ``serve --fresh`` drops them, and the page's "new session" moves the old
session's tables into a schema of their own (``archive_NNN``, as the session folder's ``archive/NNN``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from server.relay.store.postgresql.connection import Connection
from server.relay.store.postgresql.schema import TABLES
from server.relay.store.sql.store import SQLStore


class PostgreSQLStore(SQLStore):
    """The relay's store in the PostgreSQL database at ``url`` (its tables created when new), safe to share between
    threads and with other relays serving the session (``shared``)."""

    connection: Connection
    shared = True

    def __init__(self, url: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__(Connection(url), clock)


def _present(db: psycopg.Connection) -> list[str]:
    """The session's tables that exist in the connection's schema."""
    rows = db.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND "
                      "table_name = ANY(%s)", (list(TABLES),)).fetchall()
    return sorted(str(row[0]) for row in rows)


def holds_a_session(url: str) -> bool:
    """Whether the database at ``url`` holds a session's state (a peer joined, a result or a counter kept)."""
    with psycopg.connect(url, autocommit=True) as db:
        present = set(_present(db))
        return any(db.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(table))).fetchone()
                   == (True,) for table in ("peers", "results", "arrivals", "counters") if table in present)


def drop_tables(url: str) -> int:
    """Drop the session's tables (``serve --fresh``); returns how many there were."""
    with psycopg.connect(url, autocommit=True) as db, db.transaction():
        present = _present(db)
        for table in present:
            db.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
        return len(present)


def archive_tables(url: str) -> str:
    """Move the session's tables into a new schema ``archive_NNN`` (the next free number), where they stay
    readable; returns its name. The next ``open`` creates empty tables for a new session."""
    with psycopg.connect(url, autocommit=True) as db, db.transaction():
        taken = {str(row[0]) for row in db.execute(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'archive\\_%'").fetchall()}
        number = 1 + max((int(name[8:]) for name in taken if name[8:].isdigit()), default=0)
        schema = f"archive_{number:03d}"
        db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for table in _present(db):
            db.execute(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(sql.Identifier(table), sql.Identifier(schema)))
        return schema


# The advisory lock the relay serving a database's session holds (another number than the tables' creation lock).
SESSION_LOCK = 0x7065657274726131


class SessionHold:
    """Which relay serves the session in a database: a PostgreSQL advisory lock, held on a connection of its own for
    as long as that relay lives. A second relay over the same database waits for it (``serve``), and takes the
    session over from its checkpoint once the first is gone: the lock goes with the first relay's connection, which
    the server drops when its process dies (SIGKILL included)."""

    def __init__(self, url: str) -> None:
        self._db = psycopg.connect(url, autocommit=True)
        self.closed = False

    def take(self) -> bool:
        """Whether this relay holds the session now (taken, or already held)."""
        row = self._db.execute("SELECT pg_try_advisory_lock(%s)", (SESSION_LOCK,)).fetchone()
        return bool(row and row[0])

    def held(self) -> bool:
        """Whether the hold still stands: its connection is alive and holds the lock (False once the server or
        the network dropped it: another relay may be serving the session by now)."""
        try:
            row = self._db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                                   "pid = pg_backend_pid() AND objid = %s",
                                   (SESSION_LOCK & 0xFFFFFFFF,)).fetchone()
        except psycopg.Error:
            return False
        return bool(row and row[0])

    def close(self) -> None:
        """Let the session go (the next relay waiting takes it)."""
        self.closed = True
        self._db.close()
