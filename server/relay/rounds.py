"""Synchronous rounds (``SyncRounds``), the relay's round mode unless the session runs async.

A round hands out its k slots (one lease each), takes one checked result per slot and merges when every slot has
its result and every chosen second copy is settled, or at its deadline (``server.relay.pacing``). A peer holds one
lease at a time and takes the round's next open slot once its result is in, so a round that fewer than k peers
can finish is finished by them (one peer alone trains every slot in turn); in a local task, a volunteer whose files
trained a unit of the round waits while another's could (``server.relay.local_turns``). A result refused for what
it holds (not for its lease) frees its slot at once for another peer, and that peer is not handed the slot again this
round while someone else connected may take it. A slot that every connected peer in good standing was refused for is
*blocked*: the round merges without it once the rest is in, and the unit is carried into the next round (trained
from the new weights, still once per pass); a round with no result at all hands a blocked slot back to the peers
it refused. A result of a slot that has its merged result already is a second copy (``server.relay.copies``):
compared, never merged. The rules of every mode: docs/liveness.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.aggregate.streaming import STREAMED
from runtime.planner import RoundOutOfRange
from runtime.protocol import Wait, WorkAnswer
from runtime.tasks import UnitResult
from server.relay.bans import Bans
from server.relay.book import RoundBook
from server.relay.checks import EarlyRead
from server.relay.context import RelayContext
from server.relay.copies import UnitCopies
from server.relay.jobs import Jobs
from server.relay.local_turns import LocalTurns
from server.relay.pacing import RoundPacing
from server.relay.people import Participants
from server.relay.replay_checks import ReplayChecks
from server.relay.round_mode import SPARE_TURNS
from server.relay.round_results import RoundResults
from server.relay.round_sums import RoundSums
from server.relay.store import StoredResult
from server.relay.verify import DISPUTE, Verdict
from server.session.config import SessionError


class SyncRounds:
    """A ``RoundMode`` (``server.relay.round_mode``). ``on_round_opened`` runs when a round hands out its first unit
    (the relay arms the deadline's timer)."""

    hands_out_while_merging = False  # the next round opens when the merge ends

    def __init__(self, context: RelayContext, *, book: RoundBook, jobs: Jobs, people: Participants,
                 replays: ReplayChecks, copies: UnitCopies, bans: Bans, pacing: RoundPacing,
                 on_round_opened: Callable[[], None]) -> None:
        self.context, self.book, self.jobs, self.people = context, book, jobs, people
        self.replays, self.copies, self.bans, self.pacing = replays, copies, bans, pacing
        self.on_round_opened = on_round_opened
        self.sums = RoundSums(context, book)  # (the open round's sum as its results arrive)
        self.results = RoundResults(context, book=book, jobs=jobs, people=people, replays=replays, copies=copies,
                                    bans=bans, sums=self.sums)
        self.started = False  # a unit was handed out since the relay started: the start gate is passed
        self.local_turns = LocalTurns(context)  # (a local task's files count once a round)

    # -- handing out --------------------------------------------------------------------------------------
    def next_job(self, peer_id: str) -> WorkAnswer:
        session, store, options = self.context.session, self.context.store, self.context.options
        results, leases = store.result_slots(session.round), store.leases(session.round)
        now = store.clock()
        mine = [(s, lease) for s, lease in store.leases(session.round, 1).items()
                if lease.peer_id == peer_id and lease.deadline >= now]
        if mine:  # this peer trains a second copy
            copy = self.copies.next_copy(peer_id)
            if copy is not None:
                return copy
        gate = self.start_gate()
        if gate is not None:
            return Wait(options.retry_seconds, gate)
        blocked = self.blocked_slots() if not results else set()  # (no result yet: refused peers may try again)
        assignments = session.assignments()
        held = [slot for slot, lease in leases.items()
                if lease.peer_id == peer_id and lease.deadline >= now and slot not in results]
        if held and store.shared:  # (another relay over the store may have released it, or kept its result, a
            held = [slot for slot in held if (fresh := store.lease(session.round, slot)) is not None  # moment ago)
                    and fresh.peer_id == peer_id and fresh.deadline >= now
                    and not store.has_result(session.round, slot)]
        if held:  # (the peer asks again for the unit it holds)
            slot = min(held)
            return self.jobs.job(next(a for a in assignments if a.slot == slot), leases[slot].deadline)
        turn = self.local_turns.wait(peer_id, session.round, now)
        if turn is not None:
            return Wait(options.retry_seconds, turn)
        started = bool(results) or bool(leases)
        for assignment in assignments:  # (the first open slot: no result, no live lease, not refused to this peer)
            if assignment.slot in results:
                continue
            expired = leases.get(assignment.slot)
            if expired is not None and expired.deadline >= now:
                continue
            if self.book.refused(session.round, assignment.slot, peer_id) and assignment.slot not in blocked:
                continue
            lease = store.grant(session.round, assignment.slot, assignment.unit_index, peer_id, options.lease_seconds)
            if lease is None:  # (another relay over the store leased it a moment ago: the next open slot)
                continue
            if expired is not None:
                store.count("leases_expired")
            self.started = True
            if not started:
                self.on_round_opened()
            if not self.context.replica:  # (the holder replays: a replica's peers' results are judged there)
                self.replays.prepare(peer_id, assignment.slot)
            self.context.notices.changed()
            return self.jobs.job(assignment, lease.deadline)
        copy = self.copies.next_copy(peer_id)
        if copy is not None:
            self.context.notices.changed()
            return copy
        return Wait(options.retry_seconds, f"round {session.round + 1}: waiting for other peers' units")

    def units_open(self) -> int | None:
        """The new round's units and second copies, and a few more (a refused slot, a backup): the held requests a
        round's opening wakes to look for work; the others hold on, or ask again when their hold ends."""
        session = self.context.session
        if session.done:
            return None
        try:
            assignments = session.assignments()
        except (RoundOutOfRange, SessionError):
            return None
        copies = sum(1 for a in assignments if self.copies.redundant(session.round, a.slot))
        return len(assignments) + copies + SPARE_TURNS

    def start_gate(self) -> str | None:
        """Why the session may not start yet (fewer peers connected than the host's ``--min-peers``), or None.
        The gate holds the first round until its first hand-out, never a later round: once training began, the
        session goes on with whoever is connected (a ban or a closed tab must not stop it for good). Banned peers
        and peers gone past the timeout are not connected."""
        session, store, options = self.context.session, self.context.store, self.context.options
        needed = options.min_peers
        if needed <= 1 or self.started or session.round > 0 or store.result_slots(0) or store.leases(0):
            return None
        connected = len(store.active_peers(options.peer_timeout))
        if connected >= needed:
            return None
        missing = needed - connected
        return (f"waiting for {missing} more peer{'s' if missing > 1 else ''} to start round {session.round + 1} "
                f"({connected}/{needed} connected; the host asked for --min-peers {needed})")

    def blocked_slots(self) -> set[int]:
        """Open slots (no result, no live lease) that every connected peer in good standing was refused for this
        round. Empty while nobody is connected: the round then waits for a peer, not for a refusal."""
        session, store, options = self.context.session, self.context.store, self.context.options
        round_index, now = session.round, store.clock()
        if not self.book.any_refused(round_index):  # (nobody refused: nothing blocked, and no reads of the store)
            return set()
        results, leases = store.result_slots(round_index), store.leases(round_index)
        connected = store.active_peers(options.peer_timeout)
        if not connected:
            return set()
        return {a.slot for a in session.assignments()
                if a.slot not in results and not (a.slot in leases and leases[a.slot].deadline >= now)
                and self.book.refused_by_all(round_index, a.slot, connected)}

    def carry_ready(self) -> bool:
        """The round has results and every other slot is blocked (and no second copy is awaited): it merges now
        and its blocked units open the next round."""
        session, store = self.context.session, self.context.store
        if session.done:
            return False
        results = store.result_slots(session.round)
        if not results or len(results | self.book.refused_slots(session.round)) < len(session.assignments()):
            return False  # (a slot is blocked only where some peer was refused: too few of those, nothing to read)
        if self.copies.copies_outstanding():
            return False
        blocked = self.blocked_slots()
        return bool(blocked) and len(results) + len(blocked) >= len(session.assignments())

    def waiting(self) -> str | None:
        """What the round waits for, in words for the page and ``GET /api/session`` (None: a peer asking now is
        handed something)."""
        gate = self.start_gate()
        if gate is not None:
            return gate
        session, store, options = self.context.session, self.context.store, self.context.options
        round_index, now = session.round, store.clock()
        results, leases = store.result_slots(round_index), store.leases(round_index)
        slots = len(session.assignments())
        out = sum(1 for s, lease in leases.items() if s not in results and lease.deadline >= now)
        unsent = slots - len(results) - out
        active = store.active_peers(options.peer_timeout)
        units = f"{unsent} unit{'s' if unsent > 1 else ''}"
        if not active and unsent > 0:
            return f"round {round_index + 1}: {units} wait for a peer (none is connected)"
        needed = self.replays.needed(active) if unsent > 0 else None
        if needed is not None:
            return f"round {round_index + 1}: {units} wait for {needed}"
        if unsent > 0:
            return None
        if out:
            return f"round {round_index + 1}: waiting for {out} unit{'s' if out > 1 else ''} out with peers"
        replays = self.replays.pending(round_index)
        if replays:
            return f"round {round_index + 1}: {self.replays.replaying(replays)}"
        if self.copies.copies_outstanding():
            return f"round {round_index + 1}: waiting for second copies of units to compare"
        return None

    def awaited(self, round_index: int, slot: int) -> bool:
        return False  # (the round waits for every one of its results alike)

    def holds_unit(self, peer_id: str, unit_index: int) -> bool:
        """Whether ``peer_id`` holds a live lease on ``unit_index`` in the current round (either copy)."""
        store, round_index = self.context.store, self.context.session.round
        now = store.clock()
        return any(lease.peer_id == peer_id and lease.unit_index == unit_index and lease.deadline >= now
                   for copy in (0, 1) for lease in store.leases(round_index, copy).values())

    # -- results (``server.relay.round_results``) -----------------------------------------------------------
    def reader(self, peer_id: str, round_index: int, slot: int, body: bytes) -> Callable[[], EarlyRead] | None:
        return self.results.reader(peer_id, round_index, slot, body)

    def accept(self, peer_id: str, round_index: int, slot: int, body: bytes,
               early: EarlyRead | None = None) -> StoredResult:
        return self.results.accept(peer_id, round_index, slot, body, early)

    # -- merging ------------------------------------------------------------------------------------------
    def full(self) -> bool:
        """Every slot has its result and no chosen slot still waits for its second copy."""
        session, store = self.context.session, self.context.store
        return not session.done and len(store.result_slots(session.round)) >= len(session.assignments()) \
            and not self.copies.copies_outstanding()

    def ready(self) -> bool:
        """Whether the round may merge now: every unit is back (and checked), or its deadline passed with enough
        results. Never on a replica: the holder merges."""
        if self.context.replica:
            return False
        self.copies.drop_unchecked(merging=False)  # (a unit only its engine class can check, none of it here: out)
        if self.full():
            return True
        if self.pacing.deadline_reached() or self.carry_ready():
            self.copies.drop_unchecked(merging=True)  # (merging without waiting for copies: never one unchecked)
            return True
        return False

    def merge_blocking(self) -> dict[str, Any]:
        """Merge the stored results of the current round (runs in a worker thread, or inline without a loop).

        The weights come from what ``accept`` kept; after a restart they are read back from SQLite. Nothing else
        writes results meanwhile: every slot of this round is full (or its deadline passed, and the relay is
        ``merging``) and the next round is not open."""
        session, store = self.context.session, self.context.store
        round_index = session.round
        slots = store.result_slots(round_index)
        stream = self.book.stream(round_index)
        taken = {slot: taken for slot in slots if (taken := self.book.take(round_index, slot)) is not None}
        streamed = None
        if stream is not None and set(stream.counts) == slots == set(taken):  # (every result summed: O(n) from here)
            streamed = (stream, self.sums.reread(round_index))
            kept = {slot: (result, STREAMED) for slot, (result, _) in taken.items()}
        else:  # (read back what is not here: a restart, a stale sum, an aggregator that needs every result)
            kept = {slot: (result, vector) for slot, (result, vector) in taken.items() if vector is not None}
            if len(kept) < len(slots):
                for slot, result in store.results(round_index).items():
                    if slot not in kept:
                        kept[slot] = (result, self.sums.decoded(result))
        by_slot = {a.slot: a for a in session.assignments()}
        results = [(by_slot[slot], UnitResult(vector, result.num_examples, result.metrics))
                   for slot, (result, vector) in sorted(kept.items())]
        extra: dict[str, Any] = {}
        costs = self.replays.costs(round_index)
        if costs:
            extra["verification"] = costs
        self.copies.waive_copies()
        blocked = self.blocked_slots() if not self.full() else set()
        if blocked:  # carried like a deadline's missing units (Session.complete_round)
            extra["blocked"] = sorted(by_slot[slot].unit_index for slot in blocked)
            store.count("units_carried_when_refused", len(blocked))
        deadline = self.pacing.deadline_summary(round_full=self.full())
        if deadline is not None:
            extra["deadline"] = deadline
        redundancy, backups = self.copies.redundancy_summary(round_index), self.copies.backups.summary(round_index)
        if redundancy is not None:
            extra["redundancy"] = redundancy
        if backups is not None:
            extra["backups"] = backups
        return session.complete_round(results, extra=extra or None, carry_missing=True,  # (whose data: DP's unit)
                                      contributors={slot: result.peer_id for slot, (result, _) in kept.items()},
                                      streamed=streamed)

    def progress(self) -> dict[str, int]:
        """The status's ``round_progress``: slots, results, live leases and live second copies. The status is read
        while a merge runs in its worker thread, which may move the round on (or end the session) meanwhile: the
        round is read once, and a round the plan no longer has reads as nothing to do."""
        session, store = self.context.session, self.context.store
        round_index = session.round
        try:
            slots = 0 if session.done else len(session.assignments(round_index))
        except (RoundOutOfRange, SessionError):  # (the merge ended the session, or opened a round with carried units)
            slots = 0
        if not slots:
            return {"slots": 0, "done": 0, "leased": 0, "copies": 0}
        now = store.clock()
        results, leases = store.result_slots(round_index), store.leases(round_index)
        return {"slots": slots, "done": len(results),
                "leased": sum(1 for s, lease in leases.items() if s not in results and lease.deadline >= now),
                "copies": sum(1 for lease in store.leases(round_index, 1).values() if lease.deadline >= now)}

    def weights_of_version(self, version: int) -> bytes | None:
        """Only the current round's weights are served in sync mode (``Relay.weights_of``)."""
        return None

    def settle(self, verdicts: list[Verdict]) -> None:
        """A dispute's replay settles the copies (``UnitCopies.settle_disputes``)."""
        self.copies.settle_disputes([verdict for verdict in verdicts if verdict.reason == DISPUTE])

    def restarted(self) -> None:
        self.copies.settle_after_restart()  # (what a restarted relay settles of the open round before it serves)

    def banned(self, peer_id: str) -> None:
        """Nothing more: ``Bans`` drops the peer's results of the open round and asks for the undo of merged ones."""

    def follow(self, between: dict[int, np.ndarray]) -> None:
        """Nothing to keep: a replica of a synchronous session hands out the round of the checkpoint it follows and
        only that round's weights (``sharing.py``); its holder decides the round."""
