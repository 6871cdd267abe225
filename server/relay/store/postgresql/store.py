"""``PostgreSQLStore``: the relay's store in a PostgreSQL database (``serve --store postgresql://...``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from server.relay.store.postgresql.connection import Connection
from server.relay.store.sql.store import SQLStore


class PostgreSQLStore(SQLStore):
    """The relay's store in the PostgreSQL database at ``url`` (its tables created when new), safe to share between
    threads."""

    connection: Connection

    def __init__(self, url: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__(Connection(url), clock)
