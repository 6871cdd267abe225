"""The asynchronous buffer (``server.relay.buffered``): results in arrival order, each marked with the
merge that took it (none yet: it waits in the buffer)."""

from __future__ import annotations

import json
import threading
from typing import Any

from server.relay.store.records import BufferedArrival, MergedArrival, sha256_hex
from server.relay.store.sql.database import TablePart


class SQLArrivals(TablePart):
    """``server.relay.store.protocol.ArrivalStore`` on the ``arrivals`` table.

    The asynchronous stream asks which entries arrived and how many wait on every request for work and every poll (a
    thousand peers: thousands of reads a second, each a scan of the arrivals). One relay is the table's only writer
    while it serves, so the entries are kept as read and added to as they arrive, and the count until a merge or a
    restart changes it (``forget``: the store closed or opened again)."""

    _lock = threading.RLock()
    _arrived: set[int] | None = None
    _arrived_view: frozenset[int] | None = None
    _waiting: int | None = None

    def forget(self) -> None:
        with self._lock:
            self._arrived, self._arrived_view, self._waiting = None, None, None

    def add_arrival(self, *, entry: int, unit_index: int, peer_id: str, version: int, num_examples: int,
                    metrics: dict[str, Any], message: bytes, update: bytes) -> int:
        with self._lock, self.connection.transaction() as db:
            cursor = db.execute(
                "INSERT INTO arrivals (entry, unit_index, peer_id, version, num_examples, metrics, message, "
                "update_vector, received, merge, sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?) RETURNING seq",
                (entry, unit_index, peer_id, version, num_examples, json.dumps(metrics), message, update,
                 self.clock(), sha256_hex(message)))
            seq = int(cursor.fetchone()[0])
            db.execute("UPDATE peers SET units_done = units_done + 1 WHERE id = ?", (peer_id,))
            if self._arrived is not None:
                self._arrived.add(entry)
                self._arrived_view = None
            if self._waiting is not None:
                self._waiting += 1
            return seq

    def arrived_entries(self) -> frozenset[int]:
        with self._lock:
            if self._arrived is None:
                self._arrived = {int(r[0]) for r in self.connection.run("SELECT entry FROM arrivals")}
            if self._arrived_view is None:
                self._arrived_view = frozenset(self._arrived)
            return self._arrived_view

    def buffered(self, limit: int | None = None) -> list[BufferedArrival]:
        rows = self.connection.run("SELECT seq, entry, unit_index, version, num_examples, metrics, update_vector, "
                                   "message FROM arrivals WHERE merge IS NULL ORDER BY seq"
                                   + ("" if limit is None else " LIMIT ?"), () if limit is None else (limit,))
        return [(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), bytes(r[6]), bytes(r[7])) for r in rows]

    def buffered_count(self) -> int:
        with self._lock:
            if self._waiting is None:
                self._waiting = int(self.connection.run("SELECT COUNT(*) FROM arrivals WHERE merge IS NULL")[0][0])
            return self._waiting

    def mark_merged(self, seqs: list[int], merge: int) -> None:
        with self._lock, self.connection.transaction() as db:
            self._waiting = None
            db.executemany("UPDATE arrivals SET merge = ? WHERE seq = ?", [(merge, seq) for seq in seqs])

    def unmerge_from(self, merge: int) -> int:
        with self._lock:
            self._waiting = None
            return self.connection.change("UPDATE arrivals SET merge = NULL WHERE merge >= ?", (merge,))

    def arrivals(self) -> list[MergedArrival]:
        rows = self.connection.run("SELECT seq, entry, unit_index, version, merge, num_examples, metrics, message "
                                   "FROM arrivals WHERE merge IS NOT NULL ORDER BY seq")
        return [(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), bytes(r[7])) for r in rows]

    def prune_arrivals_before(self, merge: int) -> int:
        emptied = self.connection.change("UPDATE arrivals SET message = ?, update_vector = ? WHERE merge IS NOT "
                                         "NULL AND merge < ? AND length(message) > 0", (b"", b"", merge))
        if emptied:
            self.connection.truncate_log()
        return emptied
