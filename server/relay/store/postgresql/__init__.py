"""The relay's store in PostgreSQL (``PostgreSQLStore``), for a session whose state lives in a database server: the
connection (psycopg 3) and tables here, the parts in ``server.relay.store.sql`` as SQLite's."""

from __future__ import annotations

from server.relay.store.postgresql.store import PostgreSQLStore

__all__ = ["PostgreSQLStore"]
