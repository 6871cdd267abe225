"""The next async merge's sum, taking results as they arrive (``ArrivalSums``, ``server.relay.buffered``'s part):
each result's part is computed by the thread that read it and added in one adding thread, so that a merge started
once K results wait has them summed already."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from runtime.aggregate.streaming import STREAMED, Contribution, Stream, TermTooLarge
from server.relay.context import Part, RelayContext
from server.session.buffered import effective_weights


@dataclass
class OpenSum:
    """The next merge's sum, taking results as they arrive: the merge number it is for, the weights it opened on
    (the merge's current ones) and the arrivals (seq) in it."""

    stream: Stream
    merge: int
    weights: np.ndarray
    seqs: set[int] = field(default_factory=set)


class ArrivalSums(Part):
    """``open``: the next merge's sum (None while a merge runs, or where the aggregator needs every result at once);
    ``lock``: the adding thread adds to it and the merge thread takes it under it."""

    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self.open: OpenSum | None = None
        self.lock = threading.Lock()
        self.adder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sum-adder")  # (off the event loop)

    def contribution(self, opened: OpenSum | None, update: np.ndarray, version: int,
                     count: int) -> Contribution | None:
        """A result's part of the next merge's sum, computed as it arrives (in a reader thread): None where that sum
        is gone or full already (the merge then adds the result itself) or cannot take it (the merge says why)."""
        if opened is None or self.open is not opened or version > opened.merge or \
                self.store.buffered_count() >= self.session.plan.participants_per_round:
            return None
        effective = effective_weights(opened.stream.global_weights, update, opened.merge - version,
                                      self.session.config.staleness_exponent)  # (``opened.weights`` in float64)
        try:
            return opened.stream.prepare(effective, count)
        except (ValueError, TermTooLarge):
            return None

    def open_sum(self) -> None:
        """Open the next merge's sum on the weights of now, for results to join as they arrive (``OpenSum``; none
        on a replica, which does not merge)."""
        stream = None if self.context.replica else self.session.open_stream()  # (None also: an aggregator that
        # needs every result at once)
        with self.lock:
            self.open = None if stream is None else OpenSum(stream, self.session.round, self.session.weights)

    def add_on_arrival(self, seq: int, count: int, contribution: Contribution | None) -> None:
        """Add a stored arrival to the next merge's sum, in the adding thread (two integer additions of n values:
        not on the event loop), where its part was computed for that sum and the sum still holds only the oldest
        buffered arrivals (so the merge, which takes the oldest K, takes every result in it)."""
        if contribution is not None:
            self.adder.submit(self._add, seq, count, contribution)

    def _add(self, seq: int, count: int, contribution: Contribution) -> None:
        with self.lock:
            opened = self.open
            if opened is None or contribution.stream is not opened.stream or contribution.count != count or \
                    self.store.buffered_count() > self.session.plan.participants_per_round:
                return  # (the merge took the sum meanwhile, or the buffer holds more: the merge adds it)
            opened.stream.add(seq, STREAMED, count, contribution)
            opened.seqs.add(seq)

    def summed(self) -> set[int]:
        """The arrivals in the next merge's sum once the adds under way are done (tests look)."""
        self.adder.submit(lambda: None).result()
        with self.lock:
            return set() if self.open is None else set(self.open.seqs)
