"""One PostgreSQL database shared by the store's parts (``server.relay.store.sql.database.Database``), through
psycopg 3: one connection in autocommit (each call its own transaction, as SQLite's), the lock every call takes,
and ``?`` placeholders spoken as psycopg's ``%s``."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from server.relay.store.postgresql.schema import SCHEMA
from server.relay.store.sql.database import OneConnection

# The advisory lock relays take while they create the tables (two starting at once would both try): any number,
# the same for every relay of a database.
SCHEMA_LOCK = 0x7065657274726169  # "peertrai"


@functools.lru_cache(maxsize=512)
def placeholders(sql: str) -> str:
    """The parts' SQL (``?`` placeholders) as psycopg takes it (``%s``; a literal ``%``, as in ``LIKE``, doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Statements:
    """``execute``/``executemany`` on the connection, in the parts' placeholders."""

    def __init__(self, db: psycopg.Connection) -> None:
        self._db = db

    def execute(self, sql: str, args: Sequence[Any] = ()) -> psycopg.Cursor:
        return self._db.execute(placeholders(sql), tuple(args))  # type: ignore[arg-type]

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._db.cursor() as cursor:
            cursor.executemany(placeholders(sql), [tuple(row) for row in rows])  # type: ignore[arg-type]


class Connection(OneConnection[psycopg.Connection]):
    """The database at ``url`` (``postgresql://user:password@host:port/name``), one connection safe to share between
    threads: every statement runs under one lock."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__()

    @property
    def path(self) -> Path | None:
        return None  # (its bytes are the server's)

    @property
    def location(self) -> str:
        return self.url

    def open(self) -> None:
        with self._lock:
            if self._db is not None:
                return
            db = psycopg.connect(self.url, autocommit=True)
            try:
                # As SQLite's synchronous=NORMAL under WAL: a commit survives the relay being killed (the server
                # has it) without waiting for the server's disk; a crash of the database server itself may lose
                # its last fraction of a second of commits, whose units are then handed out again. On, every
                # counter and lease of every request waited for a flush.
                db.execute("SET synchronous_commit = off")
                with db.transaction():
                    db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                    db.execute(SCHEMA)  # type: ignore[arg-type]  # (a constant)
            except BaseException:
                db.close()
                raise
            self._db = db

    def closed_error(self) -> Exception:
        return psycopg.InterfaceError("the store's PostgreSQL connection is closed")

    def run(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            cursor = _Statements(self.db).execute(sql, args)
            return cursor.fetchall() if cursor.description is not None else []

    def change(self, sql: str, args: Sequence[Any] = ()) -> int:
        with self._lock:
            return int(_Statements(self.db).execute(sql, args).rowcount)

    @contextmanager
    def locked(self) -> Iterator[_Statements]:
        with self._lock:
            yield _Statements(self.db)

    @contextmanager
    def transaction(self) -> Iterator[_Statements]:
        with self._lock:
            db = self.db
            with db.transaction():
                yield _Statements(db)

    def truncate_log(self) -> None:
        """Nothing: the server's autovacuum gives back what emptied rows took."""

    def disk_bytes(self) -> int:
        return 0  # (kept by the server, maybe on another machine)
