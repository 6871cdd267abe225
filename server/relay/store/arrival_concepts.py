"""The relay store's protocol of the asynchronous buffer (``server.relay.buffered``): results in arrival order, each
marked with the merge that took it, and what a held one waits for (a part of ``server.relay.store.protocol.Store``
beside ``server.relay.store.concepts``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from server.relay.store.records import BufferedArrival, MergedArrival


class ArrivalStore(Protocol):
    """Asynchronous mode (``server.relay.buffered``): results in arrival order, merged K at a time."""

    def add_arrival(self, *, entry: int, unit_index: int, peer_id: str, version: int, num_examples: int,
                    metrics: dict[str, Any], message: bytes, update: bytes, sha256: str | None = None) -> int:
        """Keep a result in the buffer and count a unit done by its peer; returns its arrival number (seq, rising).
        A second arrival of the same ``entry`` raises ``AlreadyArrived`` and changes nothing. ``sha256``: the
        message's digest for the audit, where the caller computed it already (a reader thread: not on the event
        loop)."""

    def arrived_entries(self) -> frozenset[int]:
        """The entries of every arrival, merged or not."""

    def arrived(self, entry: int) -> bool:
        """Whether ``entry`` is among ``arrived_entries`` (without copying them: every request for work asks)."""

    def arrived_count(self) -> int:
        """How many entries ``arrived_entries`` holds."""

    def has_arrived(self, entry: int) -> bool:
        """Whether ``entry`` has its result, read now from the database (another relay may have taken it a moment
        ago: ``arrived_entries`` is what the store keeps)."""

    def buffered(self, limit: int | None = None) -> list[BufferedArrival]:
        """The arrivals not merged yet, in arrival order (the first ``limit`` of them: a merge reads only what it
        merges, while a crowd's buffer may hold many more), messages included."""

    def buffered_count(self) -> int: ...

    def buffered_seqs(self, limit: int) -> list[int]:
        """The arrival numbers of the first ``limit`` arrivals not merged yet (what the next merge takes)."""

    def remove_arrivals_of(self, peer_id: str) -> list[int]:
        """Take the arrivals of ``peer_id`` not merged yet out of the buffer (its peer was banned), with its leases in
        the stream; returns their entries, which have no result any more."""

    def unmerged_arrival(self, entry: int, *, take: bool = False) -> tuple[str, bytes] | None:
        """``entry``'s arrival waiting in the buffer, as (peer, message) (None: none); ``take``: take it out too."""

    def mark_merged(self, seqs: list[int], merge: int) -> None:
        """The arrivals ``seqs`` went into merge number ``merge``."""

    def unmerge_from(self, merge: int) -> int:
        """After a restart: arrivals marked for merges from ``merge`` on (the checkpoint lacks them) go back to the
        buffer; returns how many."""

    def arrivals(self) -> list[MergedArrival]:
        """Every merged arrival, in arrival order (what the simulator replays)."""

    def prune_arrivals_before(self, merge: int) -> int:
        """Empty the messages and updates of arrivals merged before merge ``merge``, and the messages of those
        entries' second copies (async copies, round -1: their dispute or agreement is over once the entry merged);
        returns how many messages were emptied."""

    def hold_arrival(self, entry: int, peer_id: str, waiting: Collection[str]) -> None:
        """What ``entry``'s arrival from ``peer_id`` waits for before it may merge (its replay, its copy; empty: it
        waits for nothing): the relay's holds, kept so that a restart holds them again."""

    def held_arrivals(self) -> list[tuple[int, int, str, int, frozenset[str]]]:
        """The arrivals not merged yet that wait for something: (seq, entry, peer, version, what), in arrival order."""
