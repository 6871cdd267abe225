"""Host replays in async mode (``ArrivalChecks``, the asynchronous buffer's part: ``server.relay.buffered``).

The same rules pick which results are replayed as in synchronous rounds (``server.relay.verify``: every peer's first,
a seeded share, the coverage bound), each replayed from the version its result started from (the buffer keeps the
versions a result may start from). A merge takes the oldest K results of the buffer; while one of those waits for
its replay, the merge waits (the results behind it wait with it, in arrival order, so which results a merge takes
does not depend on how fast the replays run). A passed replay lets its result be merged; a failed one bans its peer
(``server.relay.bans``) and drops every result of that peer still in the buffer, whose units go out again. What a
banned peer's results moved before the ban stays merged: async mode merges a stream, not rounds, so there is nothing
to merge again without them; a peer's first result is always replayed and never merged before its verdict, so a peer
that lies from its first result moves nothing, and one that lies later lands at most what its coverage bound
(``--verify-every``) lets pass between two replays, each held to the update checks and the aggregator's bound. The
held results are this relay's memory: after a restart they are merged without the verdicts the restart lost (the
replays of the results that come after it go on).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from runtime.planner import Assignment
from server.relay.context import Part, RelayContext
from server.relay.replay_checks import ReplayChecks
from server.relay.store import StoredResult
from server.relay.verify import Verdict


class ArrivalChecks(Part):
    """Which arrivals wait for their replay (``held``: (schedule entry, peer) -> arrival number: an entry a ban sent
    out again arrives again from another peer while the banned one's replay may still run), and what a verdict does
    to them. ``dropped``: the buffer's entries that go out again (a banned peer's results taken out of it)."""

    def __init__(self, context: RelayContext, replays: ReplayChecks, *, lock: threading.Lock,
                 merge_soon: Callable[[], None], dropped: Callable[[list[int]], None]) -> None:
        self.context, self.replays, self.merge_soon, self.dropped = context, replays, merge_soon, dropped
        self.held: dict[tuple[int, str], int] = {}
        self.joining: dict[tuple[int, str], Callable[[], None]] = {}  # how each joins the next merge's sum
        self.lock = lock  # (the merge's thread reads ``held`` and takes the oldest arrivals under it)

    def arrived(self, stored: StoredResult, seq: int, assignment: Assignment, vector: np.ndarray,
                base: np.ndarray, join: Callable[[], None]) -> bool:
        """An accepted arrival (``seq``) of ``assignment`` read against ``base``, its version's weights: replayed
        where the rules say so, and then held out of the merges until its verdict (``join``: how it joins the next
        merge's sum, once it passed). Whether it is held."""
        queue = self.replays.queue
        if queue is None:
            return False
        reason = queue.reason(stored.peer_id, stored.round, stored.slot)
        if reason is None:
            return False
        key = (stored.slot, stored.peer_id)
        with self.lock:
            self.held[key] = seq
        self.joining[key] = join
        self.replays.replay_arrival(assignment, base, {stored.peer_id: vector}, reason, ("arrival", *key),
                                    {stored.peer_id: stored.engine})
        return True

    def blocks(self, oldest: Callable[[], list[int]]) -> bool:
        """Whether one of the arrivals the next merge would take (``oldest``: their arrival numbers, read only where
        some arrival is held) waits for its replay."""
        return bool(self.held) and not set(self.held.values()).isdisjoint(oldest())

    def settle(self, verdicts: list[Verdict]) -> None:
        """The verdicts are in (``Relay.apply_verdicts`` has banned whoever failed, which dropped the peer's held
        results): the arrivals they judged may be merged."""
        with self.lock:
            released = [key for key in ((verdict.slot, verdict.peer_id) for verdict in verdicts)
                        if self.held.pop(key, None) is not None]
        for key in released:
            self.joining.pop(key)()
        if released:
            self.merge_soon()

    def banned(self, peer_id: str) -> None:
        """Take a banned peer's results that are still in the buffer out of it; their units go out again."""
        with self.lock:  # (not while a merge takes the oldest arrivals and marks them)
            entries = self.store.remove_arrivals_of(peer_id)
            for entry in entries:
                self.held.pop((entry, peer_id), None)
                self.joining.pop((entry, peer_id), None)
        if entries:
            self.store.count("results_dropped_by_ban", len(entries))
            self.dropped(entries)
            self.context.notices.work_changed(available=len(entries))
        self.merge_soon()  # (the merge may have waited for one of them)
