"""The relay's memory of the rounds still open (``RoundBook``): what the sync round, second copies, replays, bans
and the async buffer share, owned in one place and changed only through these methods.

- the accepted results of a round that has not merged, with their decoded weights (the merge then needs no second
  decode; after a restart they are read back from SQLite);
- the accepted updates' norms per round (the relative outlier check);
- the peers refused on each slot, which are not handed that slot again (an honest peer takes it at once instead of
  after the lease). The async stream uses round ``ASYNC_ROUND`` and the schedule entry as its slot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from server.relay.store import StoredResult

Key = tuple[int, int]  # (round, slot)


@dataclass
class RoundBook:
    _decoded: dict[Key, tuple[StoredResult, np.ndarray]] = field(default_factory=dict)
    _norms: dict[int, list[float]] = field(default_factory=dict)
    _refused: dict[Key, set[str]] = field(default_factory=dict)

    # -- accepted results and their weights ----------------------------------------------------------
    def keep(self, stored: StoredResult, vector: np.ndarray) -> None:
        """Keep an accepted result (its message dropped: SQLite has it) and its decoded weights until the merge."""
        self._decoded[(stored.round, stored.slot)] = (dataclasses.replace(stored, message=b""), vector)

    def kept(self, round_index: int, slot: int) -> tuple[StoredResult, np.ndarray] | None:
        return self._decoded.get((round_index, slot))

    def kept_round(self, round_index: int) -> list[tuple[StoredResult, np.ndarray]]:
        """Every kept result of ``round_index`` (its accepted results, unless read back after a restart)."""
        return [kept for (r, _), kept in self._decoded.items() if r == round_index]

    def take(self, round_index: int, slot: int) -> tuple[StoredResult, np.ndarray] | None:
        """The kept result of a slot, forgotten here (the merge takes it)."""
        return self._decoded.pop((round_index, slot), None)

    def drop(self, round_index: int, slot: int) -> None:
        self._decoded.pop((round_index, slot), None)

    def clear(self) -> None:
        """A new session: nothing kept belongs to it."""
        self._decoded = {}

    # -- the relative check's norms --------------------------------------------------------------------
    def add_norm(self, round_index: int, norm: float) -> None:
        self._norms.setdefault(round_index, []).append(norm)

    def norms(self, round_index: int) -> list[float]:
        return list(self._norms.get(round_index, ()))

    # -- peers refused on a slot -----------------------------------------------------------------------
    def refuse(self, round_index: int, slot: int, *peers: str) -> None:
        """``peers`` are not handed ``slot`` of ``round_index`` again."""
        self._refused.setdefault((round_index, slot), set()).update(peers)

    def refused(self, round_index: int, slot: int, peer_id: str) -> bool:
        return peer_id in self._refused.get((round_index, slot), ())

    def refused_by_all(self, round_index: int, slot: int, peers: list[str]) -> bool:
        """Whether every one of ``peers`` (the connected ones) was refused for the slot: nobody here may take it."""
        return all(self.refused(round_index, slot, peer) for peer in peers)

    def forget_from(self, round_index: int) -> None:
        """A ban's undo starts the open round again from corrected weights: nothing kept of it stands."""
        self._decoded = {k: v for k, v in self._decoded.items() if k[0] < round_index}
        self._norms = {r: v for r, v in self._norms.items() if r < round_index}
        self._refused = {k: v for k, v in self._refused.items() if k[0] < round_index}

    def forget_before(self, round_index: int) -> None:
        """After a merge: norms and refusals of merged rounds are of no more use. (The async stream's refusals,
        kept under round -1, go at every merge too: a refused peer may draw that entry again from new weights.)"""
        self._norms = {r: v for r, v in self._norms.items() if r >= round_index}
        self._refused = {k: v for k, v in self._refused.items() if k[0] >= round_index}
