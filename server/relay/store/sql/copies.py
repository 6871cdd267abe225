"""Second copies of a unit (redundancy, backups): compared with the merged result, never merged."""

from __future__ import annotations

from server.relay.store.records import sha256_hex
from server.relay.store.sql.database import TablePart


class SQLCopies(TablePart):
    """``server.relay.store.concepts.CopyStore`` on the ``copies`` table."""

    def add_copy(self, round_index: int, slot: int, peer_id: str, message: bytes, outcome: str, *,
                 count_unit: bool = True, sha256: str | None = None) -> None:
        digest = sha256 or sha256_hex(message)  # (before the lock: hashing 585 KB holds nothing else up)
        with self.connection.transaction() as db:
            db.execute("INSERT INTO copies (round, slot, peer_id, message, received, outcome, sha256) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (round, slot, peer_id) DO UPDATE SET "
                       "message = excluded.message, received = excluded.received, outcome = excluded.outcome, "
                       "sha256 = excluded.sha256", (round_index, slot, peer_id, message, self.clock(), outcome,
                                                        digest))
            if count_unit:
                db.execute("UPDATE peers SET units_done = units_done + 1 WHERE id = ?", (peer_id,))

    def set_copy_outcome(self, round_index: int, slot: int, peer_id: str, outcome: str) -> None:
        self.connection.run("UPDATE copies SET outcome = ? WHERE round = ? AND slot = ? AND peer_id = ?",
                            (outcome, round_index, slot, peer_id))

    def copies(self, round_index: int) -> dict[tuple[int, str], str]:
        rows = self.connection.run("SELECT slot, peer_id, outcome FROM copies WHERE round = ?", (round_index,))
        return {(r[0], r[1]): r[2] for r in rows}

    def confirmed_peers(self) -> set[str]:
        rows = self.connection.run(
            "SELECT peer_id FROM copies WHERE outcome IN ('identical', 'agreed', 'upheld', 'replaced') UNION "
            "SELECT r.peer_id FROM results r JOIN copies c ON c.round = r.round AND c.slot = r.slot "
            "WHERE c.outcome IN ('identical', 'agreed', 'upheld') UNION "
            "SELECT a.peer_id FROM arrivals a JOIN copies c ON c.round = -1 AND c.slot = a.entry "  # (async mode's:
            "WHERE c.outcome IN ('identical', 'agreed') AND c.received >= a.received")  # not an entry arrived again)
        return {str(row[0]) for row in rows}

    def copy_message(self, round_index: int, slot: int, peer_id: str) -> bytes | None:
        rows = self.connection.run("SELECT message FROM copies WHERE round = ? AND slot = ? AND peer_id = ?",
                                   (round_index, slot, peer_id))
        return bytes(rows[0][0]) if rows else None
