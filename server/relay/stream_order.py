"""``StreamOrder``: which schedule entry the asynchronous stream (``server.relay.buffered``) hands out next.

The stream hands out the first entry of its schedule that has no result and no live lease. Found by reading every
lease on every request for work, that cost O(leases) an ask: a crowd of 10,000 peers asked 10,000 times across
10,000 leases, and the relay answered no one for tens of seconds. Here each ask costs O(log n): entries from
``frontier`` on were never seen leased; an entry below it can go out again only once its lease ran out (``deadlines``,
a heap of when each lease seen runs out) or went (released, reset, or written by another relay over a shared store:
the store's lease epoch moves on, and every lease is read again once). ``returned`` holds the entries below the
frontier that may go out again, in schedule order. What the order finds is a candidate: the store's grant decides."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from server.relay.store import Store
from server.relay.store.records import ASYNC_ROUND


class StreamOrder:
    """The candidates for the stream's next unit, in schedule order (``candidates``), kept up to date from the
    store's leases (``look``) and this relay's own grants (``granted``)."""

    def __init__(self) -> None:
        self.frontier = 0  # entries from here on: never seen leased
        self.returned: list[int] = []  # a heap: entries below the frontier whose lease ran out or went
        self.queued: set[int] = set()  # (``returned``'s entries, each once)
        self.deadlines: list[tuple[float, int]] = []  # a heap: (deadline, entry) of each lease seen
        self.epoch: int | None = None  # the store's lease epoch at the last full look

    def look(self, store: Store, start: int, now: float) -> None:
        """Bring the order up to date before an ask: every lease read again where the store's leases changed but by
        its own grants (``start``: the first entry without a result), else the leases seen that ran out return."""
        epoch = store.lease_epoch()
        if epoch != self.epoch:
            self.epoch, leases = epoch, store.leases(ASYNC_ROUND)
            self.frontier = max(start, max(leases, default=-1) + 1)
            self.returned = [entry for entry in range(start, self.frontier)
                             if entry not in leases or leases[entry].deadline < now]
            self.queued = set(self.returned)
            self.deadlines = [(lease.deadline, entry) for entry, lease in leases.items()
                              if entry >= start and lease.deadline >= now]
            heapq.heapify(self.deadlines)  # (``returned`` is in order already: a heap)
            return
        while self.deadlines and self.deadlines[0][0] < now:
            self.give_back(heapq.heappop(self.deadlines)[1])

    def candidates(self, length: int) -> Iterator[int]:
        """The entries that may go out, first in schedule order, each taken out of the order as it is handed to the
        caller (``give_back`` what was not handed out). Unbounded: the caller stops."""
        while True:
            if self.returned:
                entry = heapq.heappop(self.returned)
                self.queued.discard(entry)
            elif self.frontier < length:
                entry, self.frontier = self.frontier, self.frontier + 1
            else:
                return
            yield entry

    def give_back(self, entry: int) -> None:
        """``entry`` may go out again (a candidate passed over, or one whose lease ran out)."""
        if entry < self.frontier and entry not in self.queued:
            self.queued.add(entry)
            heapq.heappush(self.returned, entry)

    def leased(self, entry: int, deadline: float) -> None:
        """``entry`` is leased until ``deadline`` (this relay granted it, or found it granted)."""
        self.frontier = max(self.frontier, entry + 1)
        heapq.heappush(self.deadlines, (deadline, entry))
