"""The host's pause: whether work is handed out, kept where every relay serving the session (and a restart) reads it."""

from __future__ import annotations

from server.relay.store.sql.database import TablePart


class SQLPause(TablePart):
    """``server.relay.store.concepts.PauseStore`` on the ``pause`` table (one row once the host paused)."""

    def set_pause(self, paused: bool, pause_from: int | None) -> None:
        self.connection.run("INSERT INTO pause (id, paused, pause_from) VALUES (0, ?, ?) ON CONFLICT (id) DO UPDATE "
                            "SET paused = excluded.paused, pause_from = excluded.pause_from",
                            (int(paused), pause_from))

    def pause(self) -> tuple[bool, int | None]:
        rows = self.connection.run("SELECT paused, pause_from FROM pause WHERE id = 0")
        if not rows:
            return False, None
        return bool(rows[0][0]), None if rows[0][1] is None else int(rows[0][1])
