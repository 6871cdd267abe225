"""What the store's parts ask of a database, whichever one it is: statements with ``?`` placeholders, their rows,
a lock that keeps other calls out between a read and a write, and transactions.

Each database (``server.relay.store.sqlite``, ``server.relay.store.postgresql``) brings its connection and its
tables' definitions; the parts (``server.relay.store.sql``: one module per concept) write their SQL once, in the
subset both speak (``INSERT ... ON CONFLICT``, ``RETURNING``, no ``INSERT OR REPLACE``, no blob literals).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> list[Any]: ...

    def fetchone(self) -> Any: ...


class Statements(Protocol):
    """What a part may do inside ``locked`` or ``transaction``: the database's own connection, or a thin wrapper
    that speaks its placeholders."""

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any: ...


class Database(Protocol):
    """One connection to the store's database, safe to share between threads (every call takes one lock)."""

    @property
    def path(self) -> Path | None:
        """The database's file on this machine (None: it lives in a server)."""

    @property
    def location(self) -> str:
        """The file's path or the server's URL, as ``open_store`` takes it."""

    @property
    def closed(self) -> bool: ...

    def open(self) -> None:
        """Connect (again, after ``close``; nothing when open); creates the tables a new database lacks and brings
        an older one up to date."""

    def close(self) -> None: ...

    def run(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """One statement (its own transaction); its rows (none for a statement that returns none)."""

    def change(self, sql: str, args: Sequence[Any] = ()) -> int:
        """One statement that writes (its own transaction); how many rows it changed."""

    def locked(self) -> AbstractContextManager[Statements]:
        """Reads, then at most one write, that no other call may come between."""

    def transaction(self) -> AbstractContextManager[Statements]:
        """Statements that land together or not at all (a crash, a full disk between them leaves neither)."""

    def truncate_log(self) -> None:
        """Give back the room a write-ahead log took after many rows were emptied (nothing where the server
        does it itself)."""

    def disk_bytes(self) -> int:
        """Bytes the database takes on this machine's disk (0 for one kept by a server)."""


class Closable(Protocol):
    def close(self) -> None: ...


class OneConnection[C: Closable]:
    """What both databases' ``Database`` share: one driver connection (None while closed) under one lock, which every
    statement takes; ``closed_error`` is the driver's own error for a call on a closed store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._db: C | None = None

    @property
    def closed(self) -> bool:
        return self._db is None

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    @property
    def db(self) -> C:
        if self._db is None:
            raise self.closed_error()
        return self._db

    def closed_error(self) -> Exception:
        raise NotImplementedError


@dataclass(frozen=True)
class TablePart:
    """What each part of the store holds: the shared database and the store's clock."""

    connection: Database
    clock: Callable[[], float]
