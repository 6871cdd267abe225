"""The relay's store in SQLite, the embedded default: one file beside the session's checkpoints (``SQLiteStore``),
a module per concept over one shared connection."""

from __future__ import annotations

from server.relay.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
