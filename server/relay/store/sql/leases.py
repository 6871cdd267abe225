"""Leases: who trains which slot of which round (the unit's own lease, or a second copy), until when."""

from __future__ import annotations

from server.relay.store.records import ASYNC_ROUND, Lease
from server.relay.store.sql.database import TablePart

COLUMNS = "round, slot, unit_index, peer_id, issued, deadline, copy, version"  # (``Lease``'s fields, in order)
# A live lease of ``peer_id``: the two arguments are the peer and now.
LIVE = "peer_id = ? AND deadline >= ?"
# A lease whose unit has no result yet, or on a second copy (a copy's result is never the slot's).
UNDELIVERED = "(copy > 0 OR NOT EXISTS (SELECT 1 FROM results r WHERE r.round = leases.round AND r.slot = leases.slot))"


class SQLLeases(TablePart):
    """``server.relay.store.concepts.LeaseStore`` on the ``leases`` table."""

    def leases(self, round_index: int, copy: int = 0) -> dict[int, Lease]:
        rows = self.connection.run(f"SELECT {COLUMNS} FROM leases WHERE round = ? AND copy = ?", (round_index, copy))
        return {row[1]: Lease(*row) for row in rows}

    def lease(self, round_index: int, slot: int, copy: int = 0) -> Lease | None:
        rows = self.connection.run(f"SELECT {COLUMNS} FROM leases WHERE round = ? AND slot = ? AND copy = ?",
                                   (round_index, slot, copy))
        return Lease(*rows[0]) if rows else None

    def grant(self, round_index: int, slot: int, unit_index: int, peer_id: str, seconds: float,
              copy: int = 0, *, version: int = 0) -> Lease | None:
        # One statement, so the database decides: a lease another peer holds and has not let run out stays (two
        # relays over one store asking at once: one of them gets no row back), and an entry of the asynchronous
        # stream, or a round's slot, that has its result is not leased again (another relay took it a moment ago; a
        # slot's second copy is leased beside its result).
        now = self.clock()
        done: tuple[str, tuple[int, ...]] = ("", ())  # (what must not exist: the unit's result)
        if round_index == ASYNC_ROUND and copy == 0:  # (an arrived entry's second copy is leased beside it)
            done = " AND NOT EXISTS (SELECT 1 FROM arrivals a WHERE a.entry = ?)", (slot,)
        elif copy == 0:
            done = " AND NOT EXISTS (SELECT 1 FROM results r WHERE r.round = ? AND r.slot = ?)", (round_index, slot)
        taken = self.connection.run(
            "INSERT INTO leases (round, slot, unit_index, peer_id, issued, deadline, copy, version) "
            f"SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE 1 = 1{done[0]} ON CONFLICT (round, slot, copy) "
            "DO UPDATE SET unit_index = excluded.unit_index, peer_id = excluded.peer_id, issued = excluded.issued, "
            "deadline = excluded.deadline, version = excluded.version "
            "WHERE leases.deadline < excluded.issued OR leases.peer_id = excluded.peer_id RETURNING slot",
            (round_index, slot, unit_index, peer_id, now, now + seconds, copy, version, *done[1]))
        return Lease(round_index, slot, unit_index, peer_id, now, now + seconds, copy, version) if taken else None

    def release(self, round_index: int, slot: int, peer_id: str | None = None) -> None:
        if peer_id is None:
            self.connection.run("DELETE FROM leases WHERE round = ? AND slot = ?", (round_index, slot))
        else:
            self.connection.run("DELETE FROM leases WHERE round = ? AND slot = ? AND peer_id = ?",
                                (round_index, slot, peer_id))

    def swap_copies(self, round_index: int, slot: int) -> None:
        with self.connection.transaction() as db:  # (through copy 2, which the primary key leaves free)
            for source, target in ((0, 2), (1, 0), (2, 1)):
                db.execute("UPDATE leases SET copy = ? WHERE round = ? AND slot = ? AND copy = ?",
                           (target, round_index, slot, source))

    def release_leases_of(self, peer_id: str) -> int:
        return self.connection.change(f"DELETE FROM leases WHERE {LIVE}", (peer_id, self.clock()))

    def release_leases_on_leaving(self, peer_id: str) -> int:
        with self.connection.locked() as db:
            now = self.clock()
            unfinished = db.execute(f"SELECT COUNT(*) FROM leases WHERE {LIVE} AND {UNDELIVERED}",
                                    (peer_id, now)).fetchone()[0]
            db.execute(f"DELETE FROM leases WHERE {LIVE}", (peer_id, now))
            return int(unfinished)

    def release_live_leases(self) -> int:
        return self.connection.change(f"DELETE FROM leases WHERE {UNDELIVERED}")
