"""One SQLite file shared by the store's parts (``server.relay.store.sql.database.Database``): its connection, the
lock every call takes, a transaction for a call that writes more than once, and the file's size on disk."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from server.relay.store.sql.database import OneConnection
from server.relay.store.sqlite.schema import create_or_upgrade

WAL_LIMIT_BYTES = 8 << 20  # the write-ahead log is cut back to this after a checkpoint of it


class Connection(OneConnection[sqlite3.Connection]):
    """The file's one connection, safe to share between threads (the merge runs in a worker thread): every
    statement runs under one lock, and commits on its own unless ``transaction`` groups several."""

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self.path = Path(path)
        self.durable = durable
        self.path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__()

    def open(self) -> None:
        """Connect (again, after ``close``); creates the tables of a new file and upgrades an older one."""
        with self._lock:
            if self._db is not None:
                return
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL under WAL: a commit survives the process being killed (what the crash tests do); only a
            # power cut may lose the last commits, whose units are then handed out again. FULL synced every
            # commit on the event loop: 20 ms a counter under load (``peertrain bench load``). OFF: a
            # simulation's file, which needs no durability at all.
            db.execute(f"PRAGMA synchronous={'NORMAL' if self.durable else 'OFF'}")
            db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            # FAST: Debian's SQLite overwrites every deleted page with zeros (secure_delete on), so pruning a merged
            # result's message wrote its 585 KB again: 150 ms a merge of 100, under the lock every request waits on.
            # FAST zeroes what is deleted within the table's pages and leaves freed pages as they were, to be
            # written over by the next message (they hold results the relay itself had, not secrets).
            db.execute("PRAGMA secure_delete=FAST")
            create_or_upgrade(db)
            self._db = db

    @property
    def location(self) -> str:
        return str(self.path)

    def closed_error(self) -> Exception:
        return sqlite3.ProgrammingError(f"the store {self.path} is closed")

    def run(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """One statement (its own transaction); its rows."""
        with self._lock:
            return self.db.execute(sql, args).fetchall()

    def change(self, sql: str, args: Sequence[Any] = ()) -> int:
        """One statement that writes (its own transaction); how many rows it changed."""
        with self._lock:
            return int(self.db.execute(sql, args).rowcount)

    @contextmanager
    def locked(self) -> Iterator[sqlite3.Connection]:
        """Reads, then at most one write, that no other call may come between."""
        with self._lock:
            yield self.db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Statements that land together or not at all (a crash, a full disk between them leaves neither)."""
        with self._lock:
            db = self.db
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # (SQLite may have rolled back already: a full disk can)
                    db.execute("ROLLBACK")
                raise

    def truncate_log(self) -> None:
        with self._lock:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def disk_bytes(self) -> int:
        """The SQLite file with its write-ahead log and shared-memory index."""
        return sum(path.stat().st_size for path in (self.path, self.path.with_name(self.path.name + "-wal"),
                                                    self.path.with_name(self.path.name + "-shm")) if path.exists())

