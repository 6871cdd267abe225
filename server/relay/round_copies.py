"""A round's second copies as every poll asks about them (``RoundCopies``), read from the store once per change of it
(``Store.generation``; ``server.relay.copies`` keeps one): at a thousand peers each request for work went over every
slot of the round, and for each slot over every lease and copy, O(k^2) a request at k = 1,000."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import Any

from server.relay.store import Lease, Store


def by_slot(copies: dict[tuple[int, str], str]) -> dict[int, list[str]]:
    """A round's copies' outcomes (``Store.copies``) by slot."""
    pairs = sorted((slot, outcome) for (slot, _), outcome in copies.items())
    return {slot: [outcome for _, outcome in group] for slot, group in groupby(pairs, key=itemgetter(0))}


@dataclass(frozen=True)
class RoundCopies:
    """What every poll asks of a round's copies, read once per change of the store (``Store.generation``): at a
    thousand peers each request for work went over every slot, and for each slot over every lease and copy."""

    copies: dict[tuple[int, str], str]  # (slot, peer) -> outcome
    outcomes: dict[int, list[str]]  # ``by_slot``
    copy_peers: dict[int, set[str]]  # slot -> the peers with a copy of it
    leases: dict[int, Lease]  # the slots' own leases
    copy_leases: dict[int, Lease]  # their second copies' leases
    copy_slots_of: dict[str, list[int]]  # peer -> the slots whose second copy's lease it holds

    @classmethod
    def read(cls, store: Store, round_index: int) -> RoundCopies:
        copies = store.copies(round_index)
        copy_peers: dict[int, set[str]] = {}
        for slot, peer in copies:
            copy_peers.setdefault(slot, set()).add(peer)
        copy_leases = store.leases(round_index, 1)
        copy_slots_of: dict[str, list[int]] = {}
        for slot, lease in copy_leases.items():
            copy_slots_of.setdefault(lease.peer_id, []).append(slot)
        return cls(copies, by_slot(copies), copy_peers, store.leases(round_index), copy_leases, copy_slots_of)

    def trainers(self, slot: int, author: str | None) -> set[str]:
        """Peers that trained or hold ``slot`` this round (either copy, the merged result, a compared one)."""
        peers = {lease.peer_id for lease in (self.leases.get(slot), self.copy_leases.get(slot)) if lease is not None}
        if author is not None:
            peers.add(author)
        return peers | self.copy_peers.get(slot, set())


@dataclass
class Kept:
    """One value derived from the store, kept while its key (a round and the store's generation) stands and for at
    most ``seconds`` (what the clock changes without a change of the store: a lease that expires)."""

    seconds: float = math.inf
    _kept: tuple[Hashable, float, Any] | None = field(default=None, init=False, repr=False)

    def get(self, key: Hashable, now: float, compute: Callable[[], Any]) -> Any:
        kept = self._kept
        if kept is None or kept[0] != key or not 0 <= now - kept[1] < self.seconds:
            kept = self._kept = key, now, compute()
        return kept[2]
