"""Results: every accepted result with its message (so a restart loses nothing and a session can be
replayed through the simulator's merge) and its audit row (the message's sha256 and size, how it was verified).

Bounded disk: a result's message is only needed until its round is merged and checkpointed (the merge, a restart, a
dispute between two copies all read the open round's messages). ``prune_before`` then empties the messages of older
rounds and keeps what an audit needs per result. Freed pages are reused, so the file stops growing; the write-ahead
log is truncated after each prune.
"""

from __future__ import annotations

import json
from typing import Any

from server.relay.store.records import StoredResult, sha256_hex
from server.relay.store.sql.database import TablePart

COLUMNS = "round, slot, unit_index, peer_id, num_examples, metrics, message"  # a StoredResult's, in its order


def stored_result(row: tuple) -> StoredResult:
    return StoredResult(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), bytes(row[6]))


class SQLResults(TablePart):
    """``server.relay.store.concepts.ResultStore`` on the ``results`` table (``prune_before`` empties the
    ``copies``' messages too)."""

    def add_result(self, result: StoredResult, *, count_unit: bool = True) -> None:
        digest = sha256_hex(result.message)  # (before the lock: hashing 585 KB holds nothing else up)
        with self.connection.transaction() as db:
            db.execute(f"INSERT INTO results ({COLUMNS}, received, sha256, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (result.round, result.slot, result.unit_index, result.peer_id, result.num_examples,
                        json.dumps(result.metrics), result.message, self.clock(), digest,
                        len(result.message)))
            if count_unit:
                db.execute("UPDATE peers SET units_done = units_done + 1 WHERE id = ?", (result.peer_id,))

    def result_slots(self, round_index: int) -> set[int]:
        return set(self.result_peers(round_index))

    def result_peer(self, round_index: int, slot: int) -> str | None:
        return self.result_peers(round_index).get(slot)

    def result_peers(self, round_index: int) -> dict[int, str]:
        """Who delivered each slot's result (the columns before the message: no overflow page is read)."""
        return {int(row[0]): str(row[1]) for row in self.connection.run(
            "SELECT slot, peer_id FROM results WHERE round = ?", (round_index,))}

    def has_result(self, round_index: int, slot: int) -> bool:
        return bool(self.connection.run("SELECT 1 FROM results WHERE round = ? AND slot = ?", (round_index, slot)))

    def results(self, round_index: int) -> dict[int, StoredResult]:
        rows = self.connection.run(f"SELECT {COLUMNS} FROM results WHERE round = ? ORDER BY slot", (round_index,))
        return {row[1]: stored_result(row) for row in rows}

    def result(self, round_index: int, slot: int) -> StoredResult | None:
        rows = self.connection.run(f"SELECT {COLUMNS} FROM results WHERE round = ? AND slot = ?", (round_index, slot))
        return stored_result(rows[0]) if rows else None

    def all_results(self) -> list[StoredResult]:
        rows = self.connection.run(f"SELECT {COLUMNS} FROM results ORDER BY round, slot")
        return [stored_result(row) for row in rows]

    def replace_message(self, round_index: int, slot: int, message: bytes) -> None:
        self.connection.run("UPDATE results SET message = ? WHERE round = ? AND slot = ?", (message, round_index, slot))

    def remove_result(self, round_index: int, slot: int) -> None:
        self.connection.run("DELETE FROM results WHERE round = ? AND slot = ?", (round_index, slot))

    def remove_results_of(self, peer_id: str, round_index: int) -> list[int]:
        with self.connection.transaction() as db:
            slots = [r[0] for r in db.execute("SELECT slot FROM results WHERE round = ? AND peer_id = ?",
                                              (round_index, peer_id)).fetchall()]
            db.execute("DELETE FROM results WHERE round = ? AND peer_id = ?", (round_index, peer_id))
            db.execute("DELETE FROM leases WHERE round = ? AND peer_id = ?", (round_index, peer_id))
            return slots

    def reset_round(self, round_index: int) -> int:
        with self.connection.transaction() as db:
            dropped = db.execute("DELETE FROM results WHERE round = ?", (round_index,)).rowcount
            db.execute("DELETE FROM copies WHERE round = ?", (round_index,))
            db.execute("DELETE FROM leases WHERE round = ?", (round_index,))
            return int(dropped)

    def set_verification(self, round_index: int, slot: int, peer_id: str, outcome: str) -> None:
        self.connection.run("UPDATE results SET verification = CASE WHEN verification = '' THEN ? ELSE "
                            "substr(verification || '; ' || ?, 1, 500) END WHERE round = ? AND slot = ? AND "
                            "peer_id = ?", (outcome, outcome, round_index, slot, peer_id))

    def audit(self) -> list[dict[str, Any]]:
        rows = self.connection.run("SELECT round, slot, unit_index, peer_id, num_examples, metrics, sha256, size, "
                                   "verification, length(message) > 0, received FROM results ORDER BY round, slot")
        return [{"round": r[0], "slot": r[1], "unit_index": r[2], "peer_id": r[3], "num_examples": r[4],
                 "metrics": json.loads(r[5]), "sha256": r[6], "size": r[7], "verification": r[8] or "not checked",
                 "message_kept": bool(r[9]), "received": r[10]} for r in rows]

    def prune_before(self, round_index: int) -> int:
        with self.connection.transaction() as db:
            emptied = db.execute("UPDATE results SET message = ? WHERE round < ? AND length(message) > 0",
                                 (b"", round_index)).rowcount
            emptied += db.execute(  # (async copies, round -1, wait for their quorum: server.relay.arrival_copies)
                "UPDATE copies SET message = ? WHERE round < ? AND round >= 0 AND length(message) > 0",
                (b"", round_index)).rowcount
        if emptied:
            self.connection.truncate_log()
        return emptied
