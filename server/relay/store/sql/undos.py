"""Undoing a banned peer's results (``server.relay.undo``): the ``undos`` table holds each undo's state
and plan; the ``results`` table says which results passed a host replay, which are undone, which were pruned."""

from __future__ import annotations

import json
from typing import Any

from server.relay.store.records import PendingUndo
from server.relay.store.sql.database import TablePart

PASSED = "verification LIKE '%replay passed%'"
UNDONE = "verification LIKE 'undone%'"


class SQLUndos(TablePart):
    """``server.relay.store.concepts.UndoStore`` on the ``undos`` and ``results`` tables."""

    def request_undo(self, peer_id: str) -> None:
        self.connection.run("INSERT INTO undos VALUES (?, 'pending', '{}', ?) ON CONFLICT (peer_id) DO UPDATE SET "
                            "state = 'pending', plan = '{}', time = excluded.time WHERE undos.state = 'done'",
                            (peer_id, self.clock()))

    def undos(self) -> list[PendingUndo]:
        rows = self.connection.run("SELECT peer_id, state, plan FROM undos WHERE state != 'done' ORDER BY time, "
                                   "peer_id")
        return [(r[0], r[1], json.loads(r[2])) for r in rows]

    def set_undo(self, peer_id: str, state: str, plan: dict[str, Any]) -> None:
        self.connection.run("UPDATE undos SET state = ?, plan = ? WHERE peer_id = ?",
                            (state, json.dumps(plan), peer_id))

    def unverified_rounds(self, peer_id: str) -> tuple[int | None, list[int]]:
        with self.connection.locked() as db:
            verified = db.execute(f"SELECT MAX(round) FROM results WHERE peer_id = ? AND {PASSED}",
                                  (peer_id,)).fetchone()[0]
            since = -1 if verified is None else verified
            rows = db.execute(f"SELECT DISTINCT round FROM results WHERE peer_id = ? AND round >= ? AND NOT {PASSED} "
                              f"AND NOT {UNDONE} ORDER BY round", (peer_id, since)).fetchall()
            return verified, [int(r[0]) for r in rows]

    def mark_undone(self, peer_id: str, first: int, end: int) -> int:
        return self.connection.change("UPDATE results SET verification = 'undone (peer banned)' || CASE WHEN "
                                      "verification = '' THEN '' ELSE '; ' || verification END WHERE peer_id = ? AND "
                                      f"round >= ? AND round < ? AND NOT {PASSED} AND NOT {UNDONE}",
                                      (peer_id, first, end))

    def undone_slots(self, round_index: int) -> set[int]:
        rows = self.connection.run(f"SELECT slot FROM results WHERE round = ? AND {UNDONE}", (round_index,))
        return {r[0] for r in rows}

    def pruned_rounds(self, first: int, end: int) -> set[int]:
        rows = self.connection.run("SELECT DISTINCT round FROM results WHERE round >= ? AND round < ? AND "
                                   "length(message) = 0", (first, end))
        return {r[0] for r in rows}
