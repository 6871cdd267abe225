"""The relay's store in SQLite, the embedded default: one file beside the session's checkpoints (``SQLiteStore``):
the SQLite connection and tables here, the parts (a module per concept) in ``server.relay.store.sql``."""

from __future__ import annotations

from server.relay.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
