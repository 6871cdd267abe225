"""The asynchronous buffer (``server.relay.buffered``): results in arrival order, each marked with the
merge that took it (none yet: it waits in the buffer), their messages in ``arrival_messages`` beside them (marking
an arrival merged must not write its message again; pruning one deletes it there)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from server.relay.store.records import ASYNC_ROUND, AlreadyArrived, BufferedArrival, Lease, MergedArrival, sha256_hex
from server.relay.store.sql.database import TablePart


@dataclass
class KeptArrivals:
    """What ``SQLArrivals`` keeps of its table between reads (None: read it again), under its own lock."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    arrived: set[int] | None = None
    view: frozenset[int] | None = None  # (``arrived`` as handed out; made again after an arrival)
    waiting: int | None = None
    oldest: tuple[int, list[int]] | None = None  # (a limit, the arrival numbers of that many oldest waiting)


@dataclass(frozen=True)
class SQLArrivals(TablePart):
    """``server.relay.store.concepts.ArrivalStore`` on the ``arrivals`` table.

    The asynchronous stream asks which entries arrived and how many wait on every request for work and every poll (a
    thousand peers: thousands of reads a second, each a scan of the arrivals). One relay is the table's only writer
    while it serves, so the entries are kept as read and added to as they arrive, and the count until a merge or a
    restart changes it (``forget``: the store closed or opened again)."""

    kept: KeptArrivals = field(default_factory=lambda: KeptArrivals())

    def forget(self) -> None:
        with self.kept.lock:
            self.kept.arrived, self.kept.view, self.kept.waiting, self.kept.oldest = None, None, None, None

    def add_arrival(self, *, entry: int, unit_index: int, peer_id: str, version: int, num_examples: int,
                    metrics: dict[str, Any], message: bytes, update: bytes, sha256: str | None = None) -> int:
        kept = self.kept
        digest = sha256 or sha256_hex(message)  # (before the lock: hashing 585 KB holds nothing else up)
        with kept.lock:
            with self.connection.transaction() as db:
                cursor = db.execute(  # (an entry that arrived already: no row; two relays race on the same entry)
                    "INSERT INTO arrivals (entry, unit_index, peer_id, version, num_examples, metrics, message, "
                    "update_vector, received, merge, sha256, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?) "
                    "ON CONFLICT (entry) DO NOTHING RETURNING seq",
                    (entry, unit_index, peer_id, version, num_examples, json.dumps(metrics), b"", b"", self.clock(),
                     digest, len(message)))
                row = cursor.fetchone()
                if row is not None:
                    db.execute("INSERT INTO arrival_messages (seq, message, update_vector) VALUES (?, ?, ?)",
                               (row[0], message, update))
                    db.execute("UPDATE peers SET units_done = units_done + 1 WHERE id = ?", (peer_id,))
            if kept.arrived is not None:  # (once committed)
                kept.arrived.add(entry)
                kept.view = None
            if row is None:
                raise AlreadyArrived(f"unit entry {entry} already has a result")
            if kept.waiting is not None:
                kept.waiting += 1
            if kept.oldest is not None and len(kept.oldest[1]) < kept.oldest[0]:
                kept.oldest = None  # (the newest arrival is among the oldest only while fewer wait)
            return int(row[0])

    def arrived_entries(self) -> frozenset[int]:
        kept = self.kept
        with kept.lock:
            if kept.view is None:
                kept.view = frozenset(self._arrived())
            return kept.view

    def arrived(self, entry: int) -> bool:
        with self.kept.lock:
            return entry in self._arrived()

    def arrived_count(self) -> int:
        with self.kept.lock:
            return len(self._arrived())

    def _arrived(self) -> set[int]:
        """The entries kept (read first where they are not), under the lock."""
        kept = self.kept
        if kept.arrived is None:
            kept.arrived = {int(r[0]) for r in self.connection.run("SELECT entry FROM arrivals")}
        return kept.arrived

    def has_arrived(self, entry: int) -> bool:
        return bool(self.connection.run("SELECT 1 FROM arrivals WHERE entry = ?", (entry,)))

    def buffered(self, limit: int | None = None) -> list[BufferedArrival]:
        rows = self.connection.run("SELECT a.seq, a.entry, a.unit_index, a.version, a.num_examples, a.metrics, "
                                   "m.update_vector, m.message FROM arrivals a JOIN arrival_messages m ON m.seq = "
                                   "a.seq WHERE a.merge IS NULL ORDER BY a.seq"
                                   + ("" if limit is None else " LIMIT ?"), () if limit is None else (limit,))
        return [(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), bytes(r[6]), bytes(r[7])) for r in rows]

    def buffered_count(self) -> int:
        kept = self.kept
        with kept.lock:
            if kept.waiting is None:
                kept.waiting = int(self.connection.run("SELECT COUNT(*) FROM arrivals WHERE merge IS NULL")[0][0])
            return kept.waiting

    def buffered_seqs(self, limit: int) -> list[int]:
        kept = self.kept  # (every request for work asks, while the oldest wait for their checks)
        with kept.lock:
            if kept.oldest is None or kept.oldest[0] != limit:
                kept.oldest = limit, [int(r[0]) for r in self.connection.run(
                    "SELECT seq FROM arrivals WHERE merge IS NULL ORDER BY seq LIMIT ?", (limit,))]
            return list(kept.oldest[1])

    def remove_arrivals_of(self, peer_id: str) -> list[int]:
        kept = self.kept
        with kept.lock, self.connection.transaction() as db:
            entries = [int(r[0]) for r in db.execute("SELECT entry FROM arrivals WHERE peer_id = ? AND merge IS NULL",
                                                     (peer_id,)).fetchall()]
            db.execute("DELETE FROM arrival_messages WHERE seq IN (SELECT seq FROM arrivals WHERE peer_id = ? AND "
                       "merge IS NULL)", (peer_id,))
            db.execute("DELETE FROM arrivals WHERE peer_id = ? AND merge IS NULL", (peer_id,))
            db.execute("DELETE FROM leases WHERE round = ? AND peer_id = ?", (ASYNC_ROUND, peer_id))
            if kept.arrived is not None:
                kept.arrived.difference_update(entries)
                kept.view = None
            kept.waiting, kept.oldest = None, None
            return entries

    def unmerged_arrival(self, entry: int, *, take: bool = False) -> tuple[str, bytes] | None:
        kept = self.kept
        with kept.lock, self.connection.transaction() as db:
            row = db.execute("SELECT a.peer_id, m.message, a.seq FROM arrivals a JOIN arrival_messages m ON m.seq = "
                             "a.seq WHERE a.entry = ? AND a.merge IS NULL", (entry,)).fetchone()
            if row is None or not take:
                return None if row is None else (str(row[0]), bytes(row[1]))
            db.execute("DELETE FROM arrival_messages WHERE seq = ?", (row[2],))
            db.execute("DELETE FROM arrivals WHERE seq = ?", (row[2],))
            if kept.arrived is not None:
                kept.arrived.discard(entry)
                kept.view = None
            kept.waiting, kept.oldest = None, None
            return str(row[0]), bytes(row[1])

    def mark_merged(self, seqs: list[int], merge: int) -> None:
        with self.kept.lock, self.connection.transaction() as db:
            self.kept.waiting, self.kept.oldest = None, None
            db.executemany("UPDATE arrivals SET merge = ? WHERE seq = ?", [(merge, seq) for seq in seqs])

    def unmerge_from(self, merge: int) -> int:
        with self.kept.lock:
            self.kept.waiting, self.kept.oldest = None, None
            return self.connection.change("UPDATE arrivals SET merge = NULL WHERE merge >= ?", (merge,))

    def arrivals(self) -> list[MergedArrival]:
        rows = self.connection.run("SELECT a.seq, a.entry, a.unit_index, a.version, a.merge, a.num_examples, "
                                   "a.metrics, m.message FROM arrivals a LEFT JOIN arrival_messages m ON m.seq = a.seq "
                                   "WHERE a.merge IS NOT NULL ORDER BY a.seq")  # (a pruned one: no message)
        return [(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), b"" if r[7] is None else bytes(r[7]))
                for r in rows]

    def prune_arrivals_before(self, merge: int) -> int:
        with self.connection.transaction() as db:
            emptied = db.execute("DELETE FROM arrival_messages WHERE seq IN (SELECT seq FROM arrivals WHERE merge IS "
                                 "NOT NULL AND merge < ?)", (merge,)).rowcount
            emptied += db.execute(  # (kept until then: a dispute reads its copies' messages)
                "UPDATE copies SET message = ? WHERE round = ? AND length(message) > 0 AND slot IN (SELECT entry FROM "
                "arrivals WHERE merge IS NOT NULL AND merge < ?)", (b"", ASYNC_ROUND, merge)).rowcount
        if emptied:
            self.connection.truncate_log()
        return emptied

    def check_arrival(self, entry: int, peer_id: str, outcome: str) -> None:
        self.connection.change(
            "INSERT INTO arrival_checks (entry, peer_id, outcome) VALUES (?, ?, ?) ON CONFLICT (entry, peer_id) DO "
            "UPDATE SET outcome = CASE WHEN arrival_checks.outcome = '' THEN excluded.outcome ELSE "
            "substr(arrival_checks.outcome || '; ' || excluded.outcome, 1, 500) END", (entry, peer_id, outcome))

    def hold_arrival(self, entry: int, peer_id: str, waiting: Collection[str]) -> None:
        self.connection.change(
            "INSERT INTO arrival_checks (entry, peer_id, waiting) VALUES (?, ?, ?) ON CONFLICT (entry, peer_id) DO "
            "UPDATE SET waiting = excluded.waiting", (entry, peer_id, ",".join(sorted(waiting))))

    def held_arrivals(self) -> list[tuple[int, int, str, int, frozenset[str]]]:
        rows = self.connection.run(
            "SELECT a.seq, a.entry, a.peer_id, a.version, c.waiting FROM arrivals a JOIN arrival_checks c ON "
            "c.entry = a.entry AND c.peer_id = a.peer_id WHERE a.merge IS NULL AND c.waiting != '' ORDER BY a.seq")
        return [(int(r[0]), int(r[1]), str(r[2]), int(r[3]), frozenset(str(r[4]).split(","))) for r in rows]

    def audit_arrivals(self) -> list[dict[str, Any]]:
        """The merged arrivals' audit rows (``SQLResults.audit``'s, the merge as their round, and the version each
        started from), by merge and arrival."""
        rows = self.connection.run(
            "SELECT a.merge, a.entry, a.unit_index, a.peer_id, a.num_examples, a.metrics, a.sha256, a.size, "
            "c.outcome, m.seq IS NOT NULL, a.received, a.version FROM arrivals a LEFT JOIN arrival_checks c ON "
            "c.entry = a.entry AND c.peer_id = a.peer_id LEFT JOIN arrival_messages m ON m.seq = a.seq WHERE "
            "a.merge IS NOT NULL ORDER BY a.merge, a.seq")
        return [{"round": r[0], "slot": r[1], "unit_index": r[2], "peer_id": r[3], "num_examples": r[4],
                 "metrics": json.loads(r[5]), "sha256": r[6], "size": r[7], "verification": r[8] or "not checked",
                 "message_kept": bool(r[9]), "received": r[10], "started_from": r[11]} for r in rows]


class ArrivalCalls:
    """``SQLStore``'s calls on the asynchronous buffer, handed to its ``SQLArrivals`` part (the waiting count and the
    arrived entries read through ``KeptViews``' expiry on a shared store)."""

    _arrivals: SQLArrivals
    _expire: Callable[[], None]
    _releasing: Callable[[Callable[[tuple[int, int], dict[int, Lease]], list[int]]], AbstractContextManager[None]]

    def add_arrival(self, *, entry: int, unit_index: int, peer_id: str, version: int, num_examples: int,
                    metrics: dict[str, Any], message: bytes, update: bytes, sha256: str | None = None) -> int:
        return self._arrivals.add_arrival(entry=entry, unit_index=unit_index, peer_id=peer_id, version=version,
                                          num_examples=num_examples, metrics=metrics, message=message, update=update,
                                          sha256=sha256)

    def arrived_entries(self) -> frozenset[int]:
        self._expire()
        return self._arrivals.arrived_entries()

    def has_arrived(self, entry: int) -> bool:
        return self._arrivals.has_arrived(entry)

    def arrived(self, entry: int) -> bool:
        self._expire()
        return self._arrivals.arrived(entry)

    def arrived_count(self) -> int:
        self._expire()
        return self._arrivals.arrived_count()

    def buffered(self, limit: int | None = None) -> list[BufferedArrival]:
        return self._arrivals.buffered(limit)

    def buffered_count(self) -> int:
        self._expire()
        return self._arrivals.buffered_count()

    def buffered_seqs(self, limit: int) -> list[int]:
        self._expire()
        return self._arrivals.buffered_seqs(limit)

    def remove_arrivals_of(self, peer_id: str) -> list[int]:
        with self._releasing(lambda key, view: [] if key[0] != ASYNC_ROUND else [  # (its leases in the stream go
                slot for slot, lease in view.items() if lease.peer_id == peer_id]):  # too)
            return self._arrivals.remove_arrivals_of(peer_id)

    def unmerged_arrival(self, entry: int, *, take: bool = False) -> tuple[str, bytes] | None:
        return self._arrivals.unmerged_arrival(entry, take=take)

    def mark_merged(self, seqs: list[int], merge: int) -> None:
        self._arrivals.mark_merged(seqs, merge)

    def unmerge_from(self, merge: int) -> int:
        return self._arrivals.unmerge_from(merge)

    def arrivals(self) -> list[MergedArrival]:
        return self._arrivals.arrivals()

    def prune_arrivals_before(self, merge: int) -> int:
        return self._arrivals.prune_arrivals_before(merge)

    def hold_arrival(self, entry: int, peer_id: str, waiting: Collection[str]) -> None:
        self._arrivals.hold_arrival(entry, peer_id, waiting)

    def held_arrivals(self) -> list[tuple[int, int, str, int, frozenset[str]]]:
        return self._arrivals.held_arrivals()
