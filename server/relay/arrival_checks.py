"""Host replays in async mode (``ArrivalChecks``, the asynchronous buffer's part: ``server.relay.buffered``).

The same rules pick which results are replayed as in synchronous rounds (``server.relay.verify``: every peer's first, a
seeded share, the coverage bound), each replayed from the version its result started from (the buffer keeps the versions
a result may start from). A merge takes the oldest K results of the buffer that no check holds: a result waiting for its
replay (or its copy) joins a later merge once it passed, its staleness counted from the version it started from like any
result's, and the results behind it do not wait for it (one slow copy in a crowd held every merge behind it, and with
the merges the hand-out of new units), once: the next merge after one that passed over a held result waits for its check
(``HELD_PASSES``), as a result passed over again would land ever staler (a small session whose every first result waits
seconds for its replay merged them 3-5 versions late, and its updates from version 0 diverged it). Which results a merge
takes so depends on when the checks end; the store records each merge's results, from which
``server.session.buffered.replay`` gives the same weights. A passed replay lets its result be merged; a failed one bans
its peer (``server.relay.bans``) and drops every result of that peer still in the buffer, whose units go out again. What
a banned peer's results moved before the ban stays merged: async mode merges a stream, not rounds, so there is nothing
to merge again without them; a peer's first result is always replayed and never merged before its verdict, so a peer
that lies from its first result moves nothing, and one that lies later lands at most what its coverage bound
(``--verify-every``) lets pass between two replays, each held to the update checks and the aggregator's bound. The store
keeps what each held result waits for: after a restart it waits again (its replay runs again), or leaves the buffer
where its version's weights are gone (``ArrivalCopies.restore``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from runtime.planner import Assignment
from server.relay.context import Part, RelayContext
from server.relay.replay_checks import ReplayChecks, passed
from server.relay.store import StoredResult
from server.relay.store.records import ASYNC_ROUND
from server.relay.verify import DISPUTE, Verdict

REPLAY, COPY = "replay", "copy"  # what a held arrival waits for
HELD_PASSES = 1  # merges that may pass over a held arrival; the next waits for its check (module docstring)


@dataclass
class Held:
    """A held arrival: its arrival number and what it waits for. (What it adds to a merge is not kept meanwhile, n
    float64 values each, hundreds held in a crowd: the merge that takes it adds it.)"""

    seq: int
    waiting: set[str] = field(default_factory=set)
    passed: int = 0  # merges that took later arrivals without it (since this relay held it: a restart counts anew)


class ArrivalChecks(Part):
    """Which arrivals wait (``held``: keyed by schedule entry and peer, as an entry a ban sent out again arrives again
    from another peer while the banned one's replay may still run), for what (its replay, its second copy:
    ``server.relay.arrival_copies``), and what a verdict does to them. ``dropped``: the buffer's entries that go out
    again (a banned peer's results taken out of it)."""

    def __init__(self, context: RelayContext, replays: ReplayChecks, *, lock: threading.Lock,
                 merge_soon: Callable[[], None], dropped: Callable[[list[int]], None]) -> None:
        self.context, self.replays, self.merge_soon, self.dropped = context, replays, merge_soon, dropped
        self.held: dict[tuple[int, str], Held] = {}
        self._keys: dict[int, tuple[int, str]] = {}  # (``held`` by arrival number: each ask checks the oldest K)
        self._overdue: set[int] = set()  # (arrival numbers passed over by ``HELD_PASSES`` merges: each poll asks)
        self.lock = lock  # (the merge's thread reads ``held`` and takes the oldest arrivals under it)

    def hold(self, key: tuple[int, str], seq: int, reason: str) -> None:
        """Hold arrival ``seq`` (``key``: its entry and peer) out of the merges until ``release(key, reason)`` (kept
        in the store too: a restart holds it again, ``ArrivalCopies.restore``)."""
        with self.lock:
            waiting = self.held.setdefault(key, Held(seq)).waiting
            self._keys[self.held[key].seq] = key
            waiting.add(reason)
            now = set(waiting)
        self.store.hold_arrival(*key, now)

    def release(self, keys: Iterable[tuple[int, str]], reason: str) -> None:
        """What waited for ``reason`` has it: an arrival waiting for nothing more joins the next merge."""
        released, changed = False, []
        with self.lock:
            for key in keys:
                held = self.held.get(key)
                if held is not None and reason in held.waiting:
                    held.waiting.discard(reason)
                    changed.append((key, set(held.waiting)))
                    if not held.waiting:
                        self._unhold(key)
                        released = True
        for key, waiting in changed:
            self.store.hold_arrival(*key, waiting)
        if released:
            self.merge_soon()

    def drop(self, key: tuple[int, str]) -> None:
        """The arrival left the buffer (its copy disagreed): nothing holds it any more, and it never joins."""
        with self.lock:
            self._unhold(key)
        self.store.hold_arrival(*key, ())

    def arrived(self, stored: StoredResult, seq: int, assignment: Assignment, vector: np.ndarray,
                base: np.ndarray) -> bool:
        """An accepted arrival (``seq``) of ``assignment`` read against ``base``, its version's weights: replayed
        where the rules say so, and then held out of the merges until its verdict. Whether it is held."""
        queue = self.replays.queue
        if queue is None:
            return False
        reason = queue.reason(stored.peer_id, stored.round, stored.slot)
        if reason is None:
            return False
        key = (stored.slot, stored.peer_id)
        self.hold(key, seq, REPLAY)
        self.replays.replay_arrival(assignment, base, {stored.peer_id: vector}, reason, ("arrival", *key),
                                    {stored.peer_id: stored.engine})
        return True

    def blocks(self, oldest: Callable[[], list[int]]) -> set[int]:
        """The arrivals among those the next merge would take (``oldest``: their arrival numbers, read only where
        some arrival is held) that wait for a replay or a copy."""
        return {seq for seq in oldest() if seq in self._keys} if self.held else set()

    def held_seqs(self) -> set[int]:
        """The arrival numbers of the held arrivals."""
        return set(self._keys)

    def held_count(self) -> int:
        """How many arrivals are held (each still in the buffer: ``drop`` and a ban take them out of both)."""
        return len(self._keys)

    def passed_over(self, last: int) -> None:
        """A merge took arrivals up to number ``last``: each held arrival before it was passed over once more. (Called
        with ``lock`` held, by the merge that takes them.)"""
        for held in self.held.values():
            if held.seq < last:
                held.passed += 1
                if held.passed >= HELD_PASSES:
                    self._overdue.add(held.seq)

    def overdue(self) -> set[int]:
        """The held arrivals that ``HELD_PASSES`` merges passed over: the next merge waits for their checks."""
        return set(self._overdue)

    def keys_of(self, seqs: Iterable[int]) -> list[tuple[int, str]]:
        """The entry and peer of each held arrival among ``seqs``, in their order."""
        return [self._keys[seq] for seq in seqs if seq in self._keys]

    def _unhold(self, key: tuple[int, str]) -> None:
        held = self.held.pop(key, None)
        if held is not None:
            self._keys.pop(held.seq, None)
            self._overdue.discard(held.seq)

    def settle(self, verdicts: list[Verdict]) -> None:
        """The verdicts are in (``Relay.apply_verdicts`` has banned whoever failed, which dropped the peer's held
        results): the arrivals they judged may be merged (a dispute's verdict settles a copy: ``ArrivalCopies``)."""
        judged = [verdict for verdict in verdicts if verdict.reason != DISPUTE]
        for verdict in judged:
            if verdict.ok and not verdict.error:
                self.store.set_verification(ASYNC_ROUND, verdict.slot, verdict.peer_id, passed(verdict))
        self.release([(verdict.slot, verdict.peer_id) for verdict in judged], REPLAY)

    def banned(self, peer_id: str) -> None:
        """Take a banned peer's results that are still in the buffer out of it; their units go out again."""
        with self.lock:  # (not while a merge takes the oldest arrivals and marks them)
            entries = self.store.remove_arrivals_of(peer_id)
            for entry in entries:
                self._unhold((entry, peer_id))
        if entries:
            self.store.count("results_dropped_by_ban", len(entries))
            self.dropped(entries)
            self.context.notices.work_changed(available=len(entries))
            self.merge_soon()  # (the merge may have waited for one of them)
