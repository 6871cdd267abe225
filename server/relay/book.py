"""The relay's memory of the rounds still open (``RoundBook``): what the sync round, second copies, replays, bans
and the async buffer share, owned in one place and changed only through these methods.

- the accepted results of a round that has not merged, and what the merge and the direction check need of their
  weights. A round whose aggregator streams (``Session.open_stream``: the default centered clipping, the mean) adds
  each result to its sum when it arrives and keeps the decoded weights only of its first ``EARLY`` results (judged
  again by direction when the round is complete); the rest is in SQLite. So the relay holds O(n) for a round of
  any k, not k decoded results, and the merge after the last result is O(n). A round whose aggregator needs every
  result at once (median, Krum, a privacy stage) keeps every result's weights to the merge, as after a restart they
  are read back from SQLite. A result dropped before the merge (its peer banned, a dispute) makes the round's sums
  stale: ``SyncRounds`` rebuilds them from SQLite, or the merge reads the results from there;
- the sum of the round's updates in arrival order (the direction check's "the round's others"), kept as it grows
  rather than summed again over every kept result at each arrival;
- the accepted updates' norms per round (the relative outlier check);
- the peers refused on each slot, which are not handed that slot again (an honest peer takes it at once instead of
  after the lease). The async stream uses round ``ASYNC_ROUND`` and the schedule entry as its slot. Where relays
  share the store (``shared``), the refusals live there instead, so that every relay serving the session honours
  every other's (``server.relay.sharing``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from runtime.aggregate.streaming import Contribution, Stream
from server.relay.store import StoredResult
from server.relay.store.concepts import RefusalStore

Key = tuple[int, int]  # (round, slot)
EARLY = 8  # a streamed round keeps the weights of its first results: those judged by direction against fewer others


def always() -> bool:
    return True


def alone() -> RefusalStore | None:
    return None


@dataclass
class RoundBook:
    judges_direction: Callable[[], bool] = always  # whether the sum of each round's updates is kept
    shared: Callable[[], RefusalStore | None] = alone  # the store other relays read the refusals from, if any
    _decoded: dict[Key, tuple[StoredResult, np.ndarray | None]] = field(default_factory=dict)
    _norms: dict[int, list[float]] = field(default_factory=dict)
    _refused: dict[Key, set[str]] = field(default_factory=dict)
    _streams: dict[int, Stream] = field(default_factory=dict)
    _sums: dict[int, tuple[np.ndarray | None, int]] = field(default_factory=dict)  # round -> (sum of weights, how many)
    _stale: set[int] = field(default_factory=set)

    # -- accepted results and their weights ----------------------------------------------------------
    def open_stream(self, round_index: int, stream: Stream | None) -> None:
        """Sum ``round_index``'s results as they arrive (called before its first one); None: keep them instead."""
        if stream is not None:
            self._streams[round_index] = stream
        self._stale.discard(round_index)

    def stream(self, round_index: int) -> Stream | None:
        """The round's sum, if it holds every kept result of the round."""
        return self._streams.get(round_index)

    def stale(self, round_index: int) -> bool:
        """A result summed into the round was dropped: its sums must be rebuilt from what is stored."""
        return round_index in self._stale

    def keep(self, stored: StoredResult, vector: np.ndarray, contribution: Contribution | None = None) -> None:
        """Keep an accepted result (its message dropped: SQLite has it): add it to the round's sums (``contribution``:
        its part of the round's stream, computed as it arrived), and keep its decoded weights unless the round streams
        and it is not among the first ``EARLY``."""
        key = (stored.round, stored.slot)
        stream = self._streams.get(stored.round)
        if stream is not None:
            stream.add(stored.slot, vector, stored.num_examples, contribution)
        total, count = self._sums.get(stored.round, (None, 0))  # (count: the round's results kept before this one)
        self._decoded[key] = (dataclasses.replace(stored, message=b""), vector if stream is None or count < EARLY
                              else None)
        if self.judges_direction():  # (a relay that does not skips an O(n) addition a result)
            total = vector.astype(np.float64) if total is None else np.add(total, vector, out=total)
        self._sums[stored.round] = (total, count + 1)

    def slots_of(self, round_index: int, peer_id: str) -> list[int]:
        """The slots of ``round_index`` whose kept result came from ``peer_id``."""
        return [slot for (r, slot), (stored, _) in self._decoded.items()
                if r == round_index and stored.peer_id == peer_id]

    def kept(self, round_index: int, slot: int) -> tuple[StoredResult, np.ndarray] | None:
        """A kept result with its weights (None: not kept, or its weights are in SQLite only)."""
        kept = self._decoded.get((round_index, slot))
        return (kept[0], kept[1]) if kept is not None and kept[1] is not None else None

    def kept_round(self, round_index: int) -> list[tuple[StoredResult, np.ndarray]]:
        """The kept results of ``round_index`` that have their weights here (its accepted results, or the first of
        a streamed round's; after a restart they are read back from SQLite)."""
        return [(stored, vector) for (r, _), (stored, vector) in self._decoded.items()
                if r == round_index and vector is not None]

    def results_kept(self, round_index: int) -> int:
        return sum(1 for r, _ in self._decoded if r == round_index)

    def sum_of_updates(self, round_index: int, global_weights: np.ndarray) -> np.ndarray | None:
        """The sum of the kept results' updates (w - global, float64, added in arrival order); None before the
        first."""
        total, count = self._sums.get(round_index, (None, 0))
        if total is None:
            return None
        return total - count * global_weights.astype(np.float64)

    def take(self, round_index: int, slot: int) -> tuple[StoredResult, np.ndarray | None] | None:
        """The kept result of a slot (its weights None where they were summed and not kept), forgotten here."""
        return self._decoded.pop((round_index, slot), None)

    def drop(self, round_index: int, slot: int, vector: np.ndarray | None = None) -> None:
        """A result leaves the round before its merge. With its weights (kept here, or ``vector``: the same bits it
        was added with) it is taken out of the round's sums, exactly (``Stream.remove``); without them the sums are
        stale and are rebuilt from what is stored, O(k n) (a dispute used to do that at every copy that disagreed)."""
        kept = self._decoded.pop((round_index, slot), None)
        if kept is None:
            return
        vector = kept[1] if kept[1] is not None else vector
        stream, (total, count) = self._streams.get(round_index), self._sums.get(round_index, (None, 0))
        if vector is None or (stream is not None and slot not in stream.counts):
            self._streams.pop(round_index, None)
            self._sums.pop(round_index, None)
            self._stale.add(round_index)
            return
        if stream is not None:
            stream.remove(slot, vector)
        if total is not None:
            np.subtract(total, vector, out=total)
        self._sums[round_index] = (total if count > 1 else None, count - 1)

    def rebuild(self, round_index: int, stream: Stream | None,
                results: list[tuple[StoredResult, np.ndarray]]) -> None:
        """The round's sums again from its stored results (after a drop), in the order given."""
        self._decoded = {k: v for k, v in self._decoded.items() if k[0] != round_index}
        self._sums.pop(round_index, None)
        self._streams.pop(round_index, None)
        self.open_stream(round_index, stream)
        for stored, vector in results:
            self.keep(stored, vector)

    def clear(self) -> None:
        """A new session: nothing kept belongs to it."""
        self._decoded, self._streams, self._sums, self._stale = {}, {}, {}, set()

    # -- the relative check's norms --------------------------------------------------------------------
    def add_norm(self, round_index: int, norm: float) -> None:
        self._norms.setdefault(round_index, []).append(norm)

    def norms(self, round_index: int) -> list[float]:
        return list(self._norms.get(round_index, ()))

    # -- peers refused on a slot -----------------------------------------------------------------------
    def refuse(self, round_index: int, slot: int, *peers: str) -> None:
        """``peers`` are not handed ``slot`` of ``round_index`` again."""
        store = self.shared()
        if store is not None:
            store.refuse_slot(round_index, slot, peers)
        else:
            self._refused.setdefault((round_index, slot), set()).update(peers)

    def _refusals(self, round_index: int) -> dict[int, set[str]] | dict[int, frozenset[str]]:
        """Slot -> the peers refused on it in ``round_index``."""
        store = self.shared()
        if store is not None:
            return store.slot_refusals(round_index)
        return {slot: peers for (r, slot), peers in self._refused.items() if r == round_index and peers}

    def refused(self, round_index: int, slot: int, peer_id: str) -> bool:
        store = self.shared()
        if store is not None:
            return peer_id in store.slot_refusals(round_index).get(slot, ())
        return peer_id in self._refused.get((round_index, slot), ())

    def any_refused(self, round_index: int) -> bool:
        """Whether any peer was refused on any slot of ``round_index`` (without one, no slot is blocked)."""
        return bool(self._refusals(round_index))

    def refused_slots(self, round_index: int) -> set[int]:
        """The slots of ``round_index`` on which some peer was refused (only those can be blocked)."""
        return set(self._refusals(round_index))

    def refused_by_all(self, round_index: int, slot: int, peers: list[str]) -> bool:
        """Whether every one of ``peers`` (the connected ones) was refused for the slot: nobody here may take it."""
        return all(self.refused(round_index, slot, peer) for peer in peers)

    def forget_from(self, round_index: int) -> None:
        """A ban's undo starts the open round again from corrected weights: nothing kept of it stands."""
        self._decoded = {k: v for k, v in self._decoded.items() if k[0] < round_index}
        self._streams = {r: v for r, v in self._streams.items() if r < round_index}
        self._sums = {r: v for r, v in self._sums.items() if r < round_index}
        self._stale = {r for r in self._stale if r < round_index}
        self._norms = {r: v for r, v in self._norms.items() if r < round_index}
        self._refused = {k: v for k, v in self._refused.items() if k[0] < round_index}
        store = self.shared()
        if store is not None:
            store.forget_refusals(since=round_index)

    def forget_before(self, round_index: int) -> None:
        """After a merge: norms and refusals of merged rounds are of no more use. (The async stream's refusals,
        kept under round -1, go at every merge too: a refused peer may draw that entry again from new weights.)"""
        self._norms = {r: v for r, v in self._norms.items() if r >= round_index}
        self._refused = {k: v for k, v in self._refused.items() if k[0] >= round_index}
        store = self.shared()
        if store is not None:
            store.forget_refusals(before=round_index)
        self._streams = {r: v for r, v in self._streams.items() if r >= round_index}
        self._sums = {r: v for r, v in self._sums.items() if r >= round_index}
        self._stale = {r for r in self._stale if r >= round_index}
