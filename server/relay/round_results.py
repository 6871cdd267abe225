"""A synchronous round's results (``RoundResults``, the part of ``SyncRounds`` that takes them): a result is checked
against its lease and the round (``server.relay.checks``), then either compared as a second copy
(``server.relay.copies``) or kept for the merge: added to the round's sum as it arrives (``server.relay.book``),
stored, judged for a host replay, and, where a dispute no replay could settle waits for it, held to a quorum.
The costly reading of a result (decoding, norms, its part of the sum) may run in a worker thread before ``accept``
(``reader``); the rest runs on the event loop, where the relay's state changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from runtime.aggregate.streaming import TermTooLarge
from runtime.planner import Assignment
from server.relay.bans import Bans
from server.relay.book import RoundBook
from server.relay.checks import (
    EarlyRead,
    check_noised_norm,
    check_update_norm,
    engines_of,
    local_noise,
    read_early,
    read_result,
)
from server.relay.context import RelayContext
from server.relay.copies import UnitCopies
from server.relay.jobs import Jobs
from server.relay.people import Participants
from server.relay.refusal import Refusal
from server.relay.replay_checks import ReplayChecks
from server.relay.round_sums import RoundSums
from server.relay.store import StoredResult


class RoundResults:
    def __init__(self, context: RelayContext, *, book: RoundBook, jobs: Jobs, people: Participants,
                 replays: ReplayChecks, copies: UnitCopies, bans: Bans, sums: RoundSums) -> None:
        self.context, self.book, self.jobs, self.people = context, book, jobs, people
        self.replays, self.copies, self.bans, self.sums = replays, copies, bans, sums

    def reader(self, peer_id: str, round_index: int, slot: int, body: bytes) -> Callable[[], EarlyRead] | None:
        """What of ``accept`` a worker thread may do as the result arrives (``EarlyRead``): decode it, its norm, its
        part of the round's sum; None where its lease already refuses it (``accept`` says why)."""
        try:
            assignment, second = self._leased_assignment(peer_id, round_index, slot)
        except Refusal:
            return None
        session = self.context.session
        if not second:
            self.sums.prepare(round_index)  # (the round's first result opens its sum)
        stream = None if second else self.book.stream(round_index)
        base, digest, unit = session.weights, self.jobs.current()[2], session.work_unit(assignment)
        fingerprint = self.context.package.fingerprint

        def read() -> EarlyRead:
            outcome = read_early(body, session=session, fingerprint=fingerprint, round_index=round_index, unit=unit,
                                 base=base, base_sha256=digest)
            contribution = None
            if stream is not None and not isinstance(outcome, Refusal):
                try:
                    contribution = stream.prepare(outcome[1], outcome[2])
                except (ValueError, TermTooLarge):
                    contribution = None  # (``accept`` meets it again, on the loop, and refuses it there)
            return EarlyRead(base, outcome, contribution)
        return read

    def accept(self, peer_id: str, round_index: int, slot: int, body: bytes,
               early: EarlyRead | None = None) -> StoredResult:
        """Check and store a result, keeping its decoded weights for the merge (saves reading them back).
        ``early``: what a worker thread read of it already (``reader``)."""
        store = self.context.store
        assignment, second = self._leased_assignment(peer_id, round_index, slot)
        if early is not None and early.base is not self.context.session.weights:
            early = None  # (read against weights that are no longer the round's: an undo redid the rounds)
        if second:
            try:
                return self.copies.accept_copy(peer_id, round_index, slot, assignment, body,
                                               read=None if early is None else early.answer)
            except Refusal as refusal:
                if refusal.code == "num_examples_claim":
                    self.bans.ban_for_claim(peer_id, refusal.message)
                raise
        stored, vector, norm = self.check(peer_id, round_index, slot, body, early)
        self.sums.prepare(round_index)
        weights = self.context.session.weights
        others = self.book.sum_of_updates(round_index, weights) if self.replays.judges_direction() else None
        try:  # (first: a sum that cannot take it refuses it before anything is stored)
            self.book.keep(stored, vector, None if early is None else early.contribution)
        except TermTooLarge as error:
            self._free_slot(peer_id, round_index, slot)
            raise Refusal(422, "update_norm", str(error)) from error
        try:
            store.add_result(stored)
        except BaseException:
            self.book.drop(round_index, slot)
            raise
        own, second_copy = store.leases(round_index).get(slot), store.leases(round_index, 1).get(slot)
        came_first = second_copy is not None and second_copy.peer_id == peer_id
        if came_first:  # the copy's result came first: the other one is the copy now
            store.swap_copies(round_index, slot)
        lease = second_copy if came_first else own
        if lease is not None:
            backup_won = came_first and not self.copies.redundant(round_index, slot)
            self.copies.backups.record_unit_time(round_index, slot, lease, backup_won=backup_won)
            self.people.note_unit(peer_id, store.clock() - lease.issued, stored.engine)
        if not math.isnan(norm):
            self.book.add_norm(round_index, norm)
        self.copies.note_result(round_index, slot, peer_id)
        for liar in self.copies.quorum(round_index, slot, stored, vector):  # (a dispute no replay could settle)
            self.bans.ban(liar, f"its result of unit {stored.unit_index} in round {round_index + 1} disagreed with "
                                "two other peers' results that agreed with each other")
        copy_instead = self.replays.verify(stored, vector, others=others)  # (direction: against the round's others)
        if copy_instead is not None:  # (an engine the host cannot replay: a peer of its class trains a copy)
            self.copies.classes.require(round_index, slot, stored.engine_class, copy_instead)
        if len(store.result_slots(round_index)) >= len(self.context.session.assignments()):
            total = self.book.sum_of_updates(round_index, weights)  # (and against all the others once full)
            self.replays.verify_round(self.book.kept_round(round_index), total, self.book.results_kept(round_index))
        return stored

    def check(self, peer_id: str, round_index: int, slot: int, body: bytes,
              early: EarlyRead | None = None) -> tuple[StoredResult, np.ndarray, float]:
        """The result as it would be stored (with the relay's example count), its decoded weights and its update
        norm; a ``Refusal`` names what is wrong (``server.relay.checks``). ``early``: its read, done already."""
        assignment, _ = self._leased_assignment(peer_id, round_index, slot)
        session, options = self.context.session, self.context.options
        vector: np.ndarray | None = None
        try:
            header, vector, count, norm = early.answer() if early is not None else read_result(
                body, session=session, fingerprint=self.context.package.fingerprint, round_index=round_index,
                unit=session.work_unit(assignment), base_sha256=self.jobs.current()[2])  # (digest: once a round)
            engine, engine_class = engines_of(header.meta)
            self.copies.classes.note(peer_id, engine_class)
            unjudgeable = self.replays.refusal(engine)
            if unjudgeable is not None and not self.copies.classes.can_check(peer_id, engine, engine_class):
                raise self.replays.refuse_engine(peer_id, unjudgeable, engine)
            noise = local_noise(header.meta, session.task.kind)  # (a volunteer's own DP noise: its own bound)
            if noise is None:
                check_update_norm(norm, self.book.norms(round_index), max_norm=options.max_update_norm,
                                  outlier_factor=options.outlier_factor, min_results=options.outlier_min_results)
            else:
                check_noised_norm(norm, noise, session.spec.size, max_norm=options.max_update_norm)
                norm = math.nan  # (kept out of the round's median: its length is its noise's)
        except Refusal as refusal:
            self._free_slot(peer_id, round_index, slot)
            if refusal.code == "num_examples_claim":
                self.bans.ban_for_claim(peer_id, refusal.message)
            elif refusal.code == "update_outlier" and vector is not None:  # replay it: a cheat is banned, an
                self.replays.verify(StoredResult(round_index, slot, assignment.unit_index, peer_id, 0, {}, b"",
                                                 *engines_of(header.meta)),
                                    vector, outlier=True)  # unlucky peer is not
            raise
        return StoredResult(round_index, slot, assignment.unit_index, peer_id, count, dict(header.metrics),
                            body, *engines_of(header.meta)), vector, norm

    def _leased_assignment(self, peer_id: str, round_index: int, slot: int) -> tuple[Assignment, bool]:
        """The slot's assignment, and whether this result is a second copy (the slot has its merged result)."""
        session, store = self.context.session, self.context.store
        if session.done or round_index != session.round:
            raise Refusal(409, "stale_round", f"round {round_index} is not the current round ({session.round})")
        by_slot = {a.slot: a for a in session.assignments()}
        if slot not in by_slot:
            raise Refusal(404, "unknown_slot", f"round {round_index} has no slot {slot}")
        leases = [lease for copy in (0, 1) if (lease := store.leases(round_index, copy).get(slot))
                  is not None and lease.peer_id == peer_id]
        if not leases and store.shared:  # (granted a moment ago by a replica over the store: read afresh)
            leases = [lease for copy in (0, 1) if (lease := store.lease(round_index, slot, copy))
                      is not None and lease.peer_id == peer_id]
        author = store.result_peer(round_index, slot)
        has_result = author is not None
        if self.context.merging and not has_result:
            raise self._while_merging(round_index, slot, copy=False)
        if has_result and (not leases or author == peer_id or (slot, peer_id) in store.copies(round_index)):
            raise Refusal(409, "duplicate", f"slot {slot} of round {round_index} already has a result")
        if not leases:
            raise Refusal(403, "not_leased", f"slot {slot} of round {round_index} is not leased to this peer")
        if self.context.merging:
            raise self._while_merging(round_index, slot, copy=True)
        deadline = max(lease.deadline for lease in leases)
        if deadline < store.clock():
            raise Refusal(409, "late", f"the lease on slot {slot} expired {store.clock() - deadline:.1f} s ago")
        return by_slot[slot], has_result

    def _while_merging(self, round_index: int, slot: int, *, copy: bool) -> Refusal:
        """The refusal of a result of the round a merge (or a ban's undo) is taking: its worker thread moves the
        round's weights, number and plan meanwhile, so nothing of the round is judged then. (A second copy compared
        while a merge ran was decoded, compared and replayed against the next round's weights: two honest copies
        disagreed, both failed the replay and an honest peer was banned.)"""
        if self.bans.undo.running is not None:
            return Refusal(409, "round_redone", f"round {round_index + 1} is being merged again without a banned "
                           "peer's results; this result was trained from weights that held them" + (
                               "" if copy else ", and its unit is handed out again from the corrected weights"))
        if copy:
            return Refusal(409, "past_deadline", f"round {round_index + 1} is merging with slot {slot}'s first "
                           "result; this second copy came too late to be compared with it")
        return Refusal(409, "past_deadline", f"round {round_index + 1} passed its deadline and is merging without "
                       f"slot {slot}; the unit is trained again in the next round")

    def _free_slot(self, peer_id: str, round_index: int, slot: int) -> None:
        """After a refused result: release the lease, never hand this slot to that peer again this round."""
        self.context.store.release(round_index, slot)
        self.book.refuse(round_index, slot, peer_id)
        self.context.store.count("slots_freed_by_refusal")
        self.context.notices.work_changed()
