"""``SQLiteStore``: the relay's store in one SQLite file beside the session's checkpoints, the embedded default."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from server.relay.store.sql.store import SQLStore
from server.relay.store.sqlite.connection import Connection


class SQLiteStore(SQLStore):
    """The relay's store in the SQLite file at ``path`` (created with its folder, or opened and upgraded), safe to
    share between threads. ``durable=False`` (a simulation's file) skips syncing the file altogether."""

    connection: Connection

    def __init__(self, path: Path, clock: Callable[[], float] = time.time, *, durable: bool = True) -> None:
        super().__init__(Connection(Path(path), durable=durable), clock)
