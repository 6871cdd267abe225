"""Second copies of a unit (``UnitCopies``, a part of the relay). Two kinds: redundancy (``serve --redundancy F``),
which checks results, and backups (``serve --backup-after F``, ``server.relay.backups``), which race stragglers. A
backup's result, when it comes second, is compared like a redundancy copy (a free check), never merged nor waited for.

Redundancy: a seeded share ``F`` of each round's slots, and every result of a peer no copy has confirmed yet, is
trained twice, by two different peers (ids and, with ``--ban-addresses``, client addresses). The result that passes
the checks first is merged; the other is compared with it and never merged: from one engine (the header's
``meta.engine``) they must be identical, bit for bit; from different engines within the replay tolerance where the
task's training is reproducible across engines (``Task.replay_across_engines``), else not comparable (unchecked).

Copies that disagree go to the host: one replay judges both (``server.relay.verify``), the one that differs is
banned, and when that was the merged one the other takes its place. Without host replays both results are dropped
and the unit goes to another peer, as BOINC's validators do: the first two results that agree settle it (``quorum``),
and every other peer on the unit is banned as by a failed replay; a result that agrees with none joins the others and
the unit goes to one more peer (up to ``QUORUM_LIMIT`` results). A round merges once each chosen slot has its
comparison, unless no eligible peer is connected (the copy is then waived, and counted). After a restart an
undecided dispute is trained again. A replica hands out the copies its holder wants (``server.relay.sharing``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from runtime.planner import Assignment
from runtime.protocol import Job
from server.relay.backups import Backups
from server.relay.book import RoundBook
from server.relay.checks import (
    Read,
    check_update_norm,
    compare_results,
    decode_result,
    engines_of,
    read_result,
    relay_count,
)
from server.relay.context import Part, RelayContext
from server.relay.copy_choice import CopyChoice
from server.relay.engine_classes import SETTLED_IN_CLASS
from server.relay.jobs import Jobs
from server.relay.refusal import Refusal
from server.relay.replay_checks import ReplayChecks
from server.relay.round_copies import Kept, RoundCopies
from server.relay.store import StoredResult
from server.relay.verify import DISPUTE, Verdict

LOG = logging.getLogger("peertrain.relay")
KEEP_WAITING_SECONDS = 1.0  # how long ``copies_outstanding``'s answer is kept while the store does not change
QUORUM_LIMIT = 5  # results of one unit, all different, after which a dispute is left to the slot's usual copy

# Outcomes of a compared copy that need no more copies of the slot: "lied" is a copy whose replay failed
# while the merged result passed (a replay checked the slot); "banned" (both failed) and "unresolved" (no
# replays) leave the slot to be trained again, and its new result needs a new copy.
SETTLED = ("identical", "agreed", "not_comparable", "upheld", "replaced", "lied")


class UnitCopies(Part):
    """Which slots get a second copy and who trains it, backups, and comparing a second result with the merged one.
    A dispute goes to the host's replays (``replays``); its verdict comes back through ``settle_disputes``."""

    def __init__(self, context: RelayContext, book: RoundBook, jobs: Jobs, replays: ReplayChecks) -> None:
        self.context, self.book, self.jobs, self.replays = context, book, jobs, replays
        self.backups = Backups(context, book)
        self.classes = replays.classes  # (slots only a copy from their engine class checks: never merged unchecked)
        self.choice = CopyChoice(context, self.classes)  # (which results a copy checks)
        self._view, self._needing_kept = Kept(), Kept()  # (per round and store generation)
        self._waiting = Kept(KEEP_WAITING_SECONDS)

    def view(self, round_index: int) -> RoundCopies:  # (kept until the store changes)
        return self._view.get((round_index, self.store.generation()), 0.0,
                              lambda: RoundCopies.read(self.store, round_index))

    # -- which slots get a second copy, and who may train it ------------------------------------------
    def redundant(self, round_index: int, slot: int) -> bool:
        return self.choice.redundant(round_index, slot)

    def note_result(self, round_index: int, slot: int, peer_id: str) -> None:
        self.choice.note_result(round_index, slot, peer_id)

    # -- engines the host cannot replay: copies within an engine class (BOINC's homogeneous redundancy) ---------
    def drop_unchecked(self, *, merging: bool) -> None:
        """Results checked by a copy of their engine class alone that no peer of the class can train now (the round's
        other results are in, and none of the class is connected besides those on the slot; with ``merging``, the
        round merges without waiting for copies, after its deadline) go back out: a result the host cannot replay is
        never merged unchecked. (Asked at every poll: nothing is read before the round's results are all in.)"""
        round_index = self.session.round
        pending = self.classes.pending(round_index)
        if not pending:
            return
        results = self.store.result_slots(round_index)
        if not merging and len(results) < len(self.session.assignments()):
            return  # (copies are handed out once every unit is out; until the results are in the round cannot merge)
        view, now = self.view(round_index), self.store.clock()
        active = self.store.active_peers(self.options.peer_timeout)
        for slot in pending:
            if slot not in results or not self._needs_copy(round_index, slot, view.outcomes):
                continue
            lease = view.copy_leases.get(slot)
            if not merging and lease is not None and lease.deadline >= now and (slot, lease.peer_id) not in view.copies:
                continue  # (its copy is out)
            trainers = self._trainers(round_index, slot)
            if merging or not any(self._eligible(peer, round_index, slot, trainers) for peer in active):
                self.store.count("copies_unchecked_dropped")
                self._retrain(round_index, slot, "unchecked", self.weights(round_index, slot))

    def _needs_copy(self, round_index: int, slot: int, outcomes: dict[int, list[str]]) -> bool:
        """A chosen slot whose copies have not settled (a dispute waits for its replay). ``outcomes``: ``by_slot``."""
        if not self.redundant(round_index, slot):
            return False
        settled = SETTLED_IN_CLASS if (round_index, slot) in self.classes.slots else SETTLED
        return not any(outcome in settled or outcome == "disputed" for outcome in outcomes.get(slot, ()))

    def _trainers(self, round_index: int, slot: int) -> set[str]:
        """Peers that trained or hold ``slot`` this round (either copy, the merged result, a compared one)."""
        return self.view(round_index).trainers(slot, self.store.result_peer(round_index, slot))

    def _eligible(self, peer_id: str, round_index: int, slot: int, trainers: set[str]) -> bool:
        """Whether ``peer_id`` may train ``slot``'s copy, given the slot's ``trainers`` (``_trainers``)."""
        if peer_id in trainers or self.book.refused(round_index, slot, peer_id) or self.store.ban_reason(peer_id):
            return False
        if not self.classes.admits(peer_id, round_index, slot):
            return False
        if self.options.ban_addresses:  # addresses tell people apart: the copy comes from somewhere else
            address = self.store.peer_address(peer_id)
            return address not in {self.store.peer_address(p) for p in trainers}
        return True

    def next_copy(self, peer_id: str) -> Job | None:
        """A second copy for an idle peer (every unit of the round is out): a chosen slot's copy
        (redundancy), else a backup of the unit in flight longest, or None."""
        round_index, now = self.session.round, self.store.clock()
        view = self.view(round_index)
        copies, leases = view.copies, view.copy_leases
        by_slot_index = {a.slot: a for a in self.session.assignments()}
        for slot in sorted(view.copy_slots_of.get(peer_id, ())):  # (a copy it holds and has not delivered)
            held = leases[slot]
            if held.deadline >= now and (slot, peer_id) not in copies:
                return self._copy_job(by_slot_index[slot], held.deadline)
        for slot in self.needing(round_index):
            lease = leases.get(slot)
            if (lease is None or lease.deadline < now) and \
                    self._eligible(peer_id, round_index, slot, self._trainers(round_index, slot)):
                assignment = by_slot_index[slot]
                granted = self.store.grant(round_index, slot, assignment.unit_index, peer_id,
                                           self.options.lease_seconds, copy=1)
                if granted is not None:  # (None: another relay over the store leased it a moment ago)
                    self.store.count("copies_handed_out")
                    return self._copy_job(assignment, granted.deadline)
        backup = None if self.context.replica else self.backups.next_backup(peer_id, leases, now)
        return None if backup is None else self._copy_job(*backup)

    def _copy_job(self, assignment: Assignment, deadline: float) -> Job:
        """A copy's job: a backup says so (the page shows it); a redundancy check (a replica's are) is the slot's job
        as any peer gets it, so that its peer cannot know its result is compared (and answer honestly only then)."""
        job, redundant = self.jobs.job(assignment, deadline), self.redundant(assignment.round, assignment.slot)
        return job if redundant or self.context.replica else replace(job, copy="backup")

    def copies_outstanding(self) -> bool:
        """Whether a chosen slot still waits for its second copy: one is out, or an eligible peer is here to take it
        (else it is waived: ``waive_copies``). Kept until the store changes, at most ``KEEP_WAITING_SECONDS``."""
        return bool(self._waiting.get((self.session.round, self.store.generation()), self.store.clock(),
                                      lambda: self._waiting_copies(count_waived=False)))

    def waive_copies(self) -> None:
        """At the merge: count the chosen slots whose copy nobody eligible could train."""
        self._waiting_copies(count_waived=True)

    def needing(self, round_index: int) -> list[int]:
        """The round's slots that need a copy (``_needs_copy``) in slot order, kept while the store does not change
        (which slots are chosen changes only with a result, a copy or a dispute: each a change of the store)."""
        if self.context.replica:  # (those its holder wants)
            return sorted(self.store.wanted_copies(round_index))

        def open_chosen() -> list[int]:
            chosen = [a.slot for a in self.session.assignments() if self.redundant(round_index, a.slot)]
            outcomes = self.view(round_index).outcomes if chosen else {}
            return [slot for slot in chosen if self._needs_copy(round_index, slot, outcomes)]
        return list(self._needing_kept.get((round_index, self.store.generation()), 0.0, open_chosen))

    def _waiting_copies(self, *, count_waived: bool) -> list[int]:
        round_index, now = self.session.round, self.store.clock()
        if not (needing := self.needing(round_index)):  # (nothing to read: every poll of a full round asks this)
            return []
        view = self.view(round_index)
        active = self.store.active_peers(self.options.peer_timeout)
        waiting = []
        for slot in needing:
            lease = view.copy_leases.get(slot)
            if lease is not None and lease.deadline >= now and (slot, lease.peer_id) not in view.copies:
                waiting.append(slot)  # (out with a peer)
                continue
            trainers = self._trainers(round_index, slot)  # (once a slot, not once a connected peer)
            if any(self._eligible(peer, round_index, slot, trainers) for peer in active):
                waiting.append(slot)
            elif count_waived:
                self.store.count("copies_waived")
        return waiting

    # -- a second result of a unit ----------------------------------------------------------------------
    def accept_copy(self, peer_id: str, round_index: int, slot: int, assignment: Assignment, body: bytes, *,
                    read: Callable[[], Read] | None = None) -> StoredResult:
        """Check a result of a slot that already has its merged result, and compare the two. A refused copy frees
        the copy's lease and is not handed to that peer again (the caller bans a false example claim). ``read``:
        the message's read, done already (``EarlyRead.answer``)."""
        session = self.session
        try:
            header, vector, count, norm = read() if read is not None else read_result(
                body, session=session, fingerprint=self.context.package.fingerprint, round_index=round_index,
                unit=session.work_unit(assignment))
            check_update_norm(norm, [], max_norm=self.options.max_update_norm, outlier_factor=0, min_results=1)
        except Refusal:
            self.store.release(round_index, slot, peer_id)
            self.book.refuse(round_index, slot, peer_id)
            raise
        found = self._merged(round_index, slot)
        assert found is not None, f"round {round_index} slot {slot} has no result to compare a copy with"
        merged, merged_vector = found
        engine, engine_class = engines_of(header.meta)
        self.classes.note(peer_id, engine_class)
        outcome = self._compare(engine_class, vector, merged, merged_vector)
        self.store.add_copy(round_index, slot, peer_id, body, outcome)
        self.store.release(round_index, slot, peer_id)
        self.store.count(f"copies_{outcome}")
        if outcome in ("identical", "agreed"):
            self.store.set_verification(round_index, slot, merged.peer_id, f"copy {outcome} (from {peer_id})")
            self.choice.confirm(merged.peer_id, peer_id)
        if outcome == "disputed":
            LOG.warning("copies of round %d slot %d disagree: merged from %s (%s), copy from %s (%s)", round_index,
                        slot, merged.peer_id, merged.engine_class, peer_id, engine_class)
            self._dispute(round_index, slot, {merged.peer_id: merged_vector, peer_id: vector},
                          {merged.peer_id: merged.engine, peer_id: engine})
        return StoredResult(round_index, slot, assignment.unit_index, peer_id, count, dict(header.metrics), b"")

    def weights(self, round_index: int, slot: int) -> np.ndarray | None:
        """A slot's result's weights as the round's sum took them (None: no result), so that taking it out of the
        sum (a ban, a dispute, a result nobody can check) costs O(n), not a rebuild from every result."""
        kept = self.book.kept(round_index, slot) or self._merged(round_index, slot)  # (the book's: any engine class)
        return None if kept is None else kept[1]

    def _merged(self, round_index: int, slot: int) -> tuple[StoredResult, np.ndarray] | None:
        """A slot's result and its weights: the book's (a round's first results), or its message decoded again."""
        kept = self.book.kept(round_index, slot)
        if kept is not None and kept[0].engine_class:
            return kept
        stored = self.store.result(round_index, slot)  # (this slot's message only: a round may hold a thousand)
        if stored is None:
            return None
        header, vector = decode_result(stored.message, session=self.session, round_index=round_index)
        return StoredResult(stored.round, stored.slot, stored.unit_index, stored.peer_id, stored.num_examples,
                            stored.metrics, b"", *engines_of(header.meta)), vector

    def _compare(self, engine_class: str, vector: np.ndarray, merged: StoredResult,
                 merged_vector: np.ndarray) -> str:
        return compare_results(self.session.task, self.options, (engine_class, vector),
                               (merged.engine_class, merged_vector), self.session.weights)

    def _dispute(self, round_index: int, slot: int, results: dict[str, np.ndarray],
                 engines: dict[str, str] | None = None) -> None:
        """Two copies disagree: a host replay decides, or both go and a third peer's result settles it (``quorum``;
        the merged one's message is kept as its peer's copy for that)."""
        if self.replays.active and all(self.replays.judges(engine) for engine in (engines or {}).values()):
            self.replays.queue_replay(slot, results, DISPUTE, ("dispute", slot), engines=engines)
            return
        self._undecided(round_index, slot, results)
        self.store.count("disputes_unresolved")

    def _undecided(self, round_index: int, slot: int, vectors: dict[str, np.ndarray]) -> None:
        """The slot's result joins its disputed copies (its message kept as its peer's copy) and the unit goes to
        another peer, whose result ``quorum`` compares with them all. ``vectors``: weights by peer, the result's
        among them where at hand (it is then taken out of the round's sum, not the sum rebuilt)."""
        merged = self.store.result(round_index, slot)
        if merged is not None:
            self.store.add_copy(round_index, slot, merged.peer_id, merged.message, "disputed", count_unit=False)
        self._retrain(round_index, slot, "unresolved", None if merged is None else vectors.get(merged.peer_id))

    def quorum(self, round_index: int, slot: int, stored: StoredResult, vector: np.ndarray) -> list[str]:
        """A new result of a slot whose copies disagreed, nobody replaying them (BOINC's quorum): the first two that
        agree settle it; every other peer on the slot lied (returned, to ban), unless one of those has a confirmed
        result and none of the agreeing peers has (one cheat run twice: the slot is then copied as usual). A result
        that agrees with none joins them and the unit goes to yet another peer, up to ``QUORUM_LIMIT`` results."""
        unresolved = [peer for (s, peer), outcome in self.store.copies(round_index).items()
                      if s == slot and outcome == "unresolved"]
        if len(unresolved) < 2 or stored.peer_id in unresolved:
            return []
        agreeing = []
        for peer in unresolved:
            message = self.store.copy_message(round_index, slot, peer)
            if not message:
                return []  # (pruned: nothing to compare with)
            header, other = decode_result(message, session=self.session, round_index=round_index)
            earlier = StoredResult(round_index, slot, stored.unit_index, peer, 0, {}, b"", *engines_of(header.meta))
            if self._compare(stored.engine_class, vector, earlier, other) in ("identical", "agreed"):
                agreeing.append(peer)
        if not agreeing:
            if len(unresolved) + 1 < QUORUM_LIMIT:
                self.store.count("quorums_undecided")  # (three or more different results: ask one more peer)
                self._undecided(round_index, slot, {stored.peer_id: vector})
            else:
                self.store.count("quorums_without_majority")
            return []
        liars = [peer for peer in unresolved if peer not in agreeing]
        if self.choice.against_a_record(liars, [*agreeing, stored.peer_id]):
            self.store.count("quorums_against_a_record")  # (newcomers that agree outvote no confirmed peer)
            return []
        for peer in agreeing:
            self.store.set_copy_outcome(round_index, slot, peer, "upheld")
        for peer in liars:
            self.store.set_copy_outcome(round_index, slot, peer, "lied")
        self.store.set_verification(round_index, slot, stored.peer_id,
                                    f"quorum: agreed with {', '.join(agreeing)}, not {', '.join(liars)}")
        self.choice.confirm(*agreeing, stored.peer_id)
        self.store.count("disputes_settled_by_quorum")
        return liars

    def _retrain(self, round_index: int, slot: int, outcome: str, vector: np.ndarray | None = None) -> None:
        """Drop the slot's merged result and its copies' standing; neither peer is handed the slot again."""
        trainers = self._trainers(round_index, slot)
        for (s, peer), current in self.store.copies(round_index).items():
            if s == slot and current == "disputed":
                self.store.set_copy_outcome(round_index, slot, peer, outcome)
        self.store.remove_result(round_index, slot)
        self.book.drop(round_index, slot, vector)  # (``vector``: the merged result's weights, where at hand)
        self.store.release(round_index, slot)
        self.book.refuse(round_index, slot, *trainers)
        # (a unit only its engine class can check is trained again within it)
        self.book.refuse(round_index, slot, *self.classes.others(
            round_index, slot, lambda: self.store.active_peers(self.options.peer_timeout)))
        # one unit is free: that many held requests look for it, and as many more as peers refused it (they may wake
        # first); a thousand held peers that all looked cost the relay a search of the round each, at every dispute
        self.context.notices.work_changed(available=1 + len(trainers))

    def settle_disputes(self, verdicts: list[Verdict]) -> None:
        """After a dispute's replay (``Relay.apply_verdicts`` has banned whoever failed it, which drops a banned
        peer's merged result): the merged result stays, the copy that passed takes its place, or, when both
        failed, a third peer trains the unit."""
        round_index = self.session.round
        by_slot: dict[int, dict[str, bool]] = {}
        for verdict in verdicts:
            if verdict.round == round_index:
                by_slot.setdefault(verdict.slot, {})[verdict.peer_id] = verdict.ok
        for slot, passed in by_slot.items():
            disputed = [peer for (s, peer), o in self.store.copies(round_index).items() if s == slot
                        and o == "disputed" and peer in passed]
            for peer in disputed:
                if slot not in self.store.result_slots(round_index) and passed[peer]:
                    self._promote(round_index, slot, peer)
                else:
                    self.store.set_copy_outcome(round_index, slot, peer, "upheld" if passed[peer] else "lied")
            if slot not in self.store.result_slots(round_index):
                self._retrain(round_index, slot, "banned")
        if by_slot:
            self.context.notices.work_changed()

    def promote_settled_copy(self, round_index: int, slot: int) -> None:
        """The merged result of ``slot`` was dropped (its peer banned): a copy that matched it and comes from
        a peer in good standing is the same training, so it takes the place (else the slot is handed out)."""
        for (s, peer), outcome in self.store.copies(round_index).items():
            if s == slot and outcome in ("identical", "agreed") and not self.store.ban_reason(peer):
                self._promote(round_index, slot, peer)
                return

    def _promote(self, round_index: int, slot: int, peer_id: str) -> None:
        """The copy of ``peer_id`` becomes the slot's merged result (the merged one's peer was banned)."""
        message = self.store.copy_message(round_index, slot, peer_id)
        assert message is not None
        assignment = {a.slot: a for a in self.session.assignments()}[slot]
        header, vector = decode_result(message, session=self.session, round_index=round_index)
        count = relay_count(self.session.task, self.session.work_unit(assignment), int(header.num_examples))
        stored = StoredResult(round_index, slot, assignment.unit_index, peer_id, count, dict(header.metrics),
                              message, *engines_of(header.meta))
        self.store.add_result(stored, count_unit=False)
        self.book.keep(stored, vector)
        self.store.set_copy_outcome(round_index, slot, peer_id, "replaced")
        self.store.count("copies_promoted")

    def settle_after_restart(self) -> None:
        """After a restart: the peers a copy confirmed keep their record (read back from the store), and a dispute
        whose replay was lost with the process trains the unit again (neither result merged)."""
        self.choice.restore()
        round_index = self.session.round
        for (slot, _), outcome in self.store.copies(round_index).items():
            if outcome == "disputed":
                self._retrain(round_index, slot, "retrained_after_restart")

    def redundancy_summary(self, round_index: int) -> dict[str, int] | None:
        """The history's ``redundancy`` entry of a round: copies compared, by outcome, and waived copies."""
        if not self.options.redundancy:
            return None
        self.choice.forget_through(round_index)  # (merged: forgotten)
        self.classes.forget_through(round_index)
        outcomes = list(self.store.copies(round_index).values())
        return {"compared": len(outcomes), **{o: outcomes.count(o) for o in sorted(set(outcomes))}}
