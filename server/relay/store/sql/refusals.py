"""What relays sharing the store must agree on of the open round besides its rows: the peers refused on each slot
(``server.relay.store.concepts.RefusalStore``) and the slots that want a second copy (``WantedCopyStore``)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any

from server.relay.store.sql.database import TablePart


class SQLRefusals(TablePart):
    """The ``refusals`` table: a row per (round, slot, peer)."""

    def refuse_slot(self, round_index: int, slot: int, peers: Collection[str]) -> None:
        with self.connection.transaction() as db:
            for peer_id in peers:
                db.execute("INSERT INTO refusals (round, slot, peer_id) VALUES (?, ?, ?) "
                           "ON CONFLICT (round, slot, peer_id) DO NOTHING", (round_index, slot, peer_id))

    def slot_refusals(self, round_index: int) -> dict[int, frozenset[str]]:
        refused: dict[int, set[str]] = {}
        for slot, peer_id in self.connection.run("SELECT slot, peer_id FROM refusals WHERE round = ?",
                                                 (round_index,)):
            refused.setdefault(int(slot), set()).add(str(peer_id))
        return {slot: frozenset(peers) for slot, peers in refused.items()}

    def want_copies(self, round_index: int, slots: Collection[int]) -> None:
        with self.connection.transaction() as db:
            db.execute("DELETE FROM wanted_copies", ())
            for slot in sorted(slots):
                db.execute("INSERT INTO wanted_copies (round, slot) VALUES (?, ?)", (round_index, slot))

    def wanted_copies(self, round_index: int) -> frozenset[int]:
        return frozenset(int(row[0]) for row in self.connection.run("SELECT slot FROM wanted_copies WHERE round = ?",
                                                                    (round_index,)))

    def forget_refusals(self, *, before: int | None = None, since: int | None = None) -> None:
        if before is not None:
            self.connection.run("DELETE FROM refusals WHERE round < ?", (before,))
        if since is not None:
            self.connection.run("DELETE FROM refusals WHERE round >= ?", (since,))


class RefusalCalls:
    """``SQLStore``'s refusal and wanted-copy calls, handed to its ``SQLRefusals`` part; each round's refusals kept as
    read (every request for work asks) and forgotten on any change, or a moment later on a shared store
    (``KeptViews``)."""

    _refusals: SQLRefusals
    _refusals_cache: dict[int, dict[int, frozenset[str]]]
    _kept: Callable[..., dict[Any, Any]]  # (``KeptViews``'s)
    _changing: Callable[..., AbstractContextManager[None]]
    _expire: Callable[[], None]

    def refuse_slot(self, round_index: int, slot: int, peers: Collection[str]) -> None:
        with self._changing(self._refusals_cache):
            self._refusals.refuse_slot(round_index, slot, peers)

    def slot_refusals(self, round_index: int) -> dict[int, frozenset[str]]:
        self._expire()
        return self._kept(self._refusals_cache, round_index, lambda: self._refusals.slot_refusals(round_index))

    def forget_refusals(self, *, before: int | None = None, since: int | None = None) -> None:
        with self._changing(self._refusals_cache):
            self._refusals.forget_refusals(before=before, since=since)

    def want_copies(self, round_index: int, slots: Collection[int]) -> None:
        self._refusals.want_copies(round_index, slots)

    def wanted_copies(self, round_index: int) -> frozenset[int]:  # (read afresh: a copy the holder no longer wants,
        return self._refusals.wanted_copies(round_index)  # its result in, would be trained for nothing)
