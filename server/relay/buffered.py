"""Buffered asynchronous mode (``serve --mode async --buffer K``): ``AsyncBuffer``, the relay's round mode then.

Peers never wait for a round: each gets the next unit of the plan's schedule at once, with the newest weights
version, and its result says the version it started from (the result's ``round``). A result is checked like a
round's (lease, wire, example count, update norm against the weights it started from) and kept in SQLite (an update
message as it came: the update it carries is what merges; a weights message with ``result - w_v`` beside it); once K
accepted results wait that no check holds, the relay merges the oldest K of them (``buffered_merge``; a held result
is passed over once at most: ``server.relay.arrival_checks``), each weighted
by ``(1 + s) ** -a`` for its staleness s
(``server.session.buffered``), checkpoints the new version, and validates every ``--validate-every`` merges. A
result more than ``--max-staleness`` versions old is refused (``409 too_stale``). The mode and its settings belong to
the session (``SessionConfig``: a restart keeps them). Leases use round -1 and the schedule entry as their slot.

Crash safety: a merge marks its results in SQLite before its checkpoint is written; on start, results marked
for a merge the checkpoint does not hold go back to the buffer, so a SIGKILL loses nothing and merges nothing
twice. Host replays and second copies judge results against the version each started from
(``server.relay.arrival_checks``, ``server.relay.arrival_copies``); backups are a synchronous-mode feature. Liveness:
a unit refused to one peer goes to another connected peer; when every connected peer was refused for it, it is
handed out again (the weights have moved on meanwhile, or the refused peer tries once more).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime import wire
from runtime.planner import Assignment
from runtime.protocol import Wait, WorkAnswer
from runtime.wire import WireHeader, weights_sha256
from server.relay.arrival_checks import ArrivalChecks
from server.relay.arrival_copies import ArrivalCopies
from server.relay.book import RoundBook
from server.relay.buffered_merge import merge_oldest
from server.relay.checks import EarlyRead, check_update_norm, engines_of, read_parts, read_result
from server.relay.context import Part, RelayContext
from server.relay.copy_choice import CopyChoice
from server.relay.jobs import Jobs
from server.relay.open_sum import ArrivalSums
from server.relay.people import Participants
from server.relay.refusal import Refusal
from server.relay.replay_checks import ReplayChecks
from server.relay.round_mode import SPARE_TURNS
from server.relay.store import AlreadyArrived, StoredResult
from server.relay.store.records import ASYNC_ROUND, sha256_hex
from server.relay.stream_order import StreamOrder
from server.relay.verify import Verdict
from server.session.buffered import entry_assignment, update_of

BACKLOG_MERGES = 2  # hand-out waits while this many merges' results (2 K) wait in the buffer
GRANT_TRIES = 16  # grants another relay beat this one to, at most, before an ask is told to ask again
NORMS_KEPT = 50  # accepted update norms the relative outlier check compares with


class AsyncBuffer(Part):
    """The async stream, a ``RoundMode`` (``server.relay.round_mode``): hand-out in schedule order, results judged
    against the version they started from, a merge of the oldest K. Its state: the weights of recent versions, the
    version each entry went out with, the last accepted update norms, the first schedule entry not back yet."""

    hands_out_while_merging = True  # peers never wait for a round: a unit starts from the version it is handed

    def __init__(self, context: RelayContext, book: RoundBook, jobs: Jobs, people: Participants, replays: ReplayChecks,
                 merge_soon: Callable[[], None], ban: Callable[[str, str], None], choice: CopyChoice) -> None:
        self.context, self.book, self.jobs, self.people, self.replays = context, book, jobs, people, replays
        self.versions: dict[int, np.ndarray] = jobs.kept  # (jobs name them and serve their weights by digest)
        self.holding: dict[str, int] = {}  # peer -> the entry it was handed last (its lease is checked on each ask)
        self.digests: dict[int, tuple[np.ndarray, str]] = {}  # version -> (its weights, their sha256)
        self.norms: list[float] = []
        self.next = 0
        self.order = StreamOrder()  # (which entry goes out next: found without reading every lease on each ask)
        self.sums = ArrivalSums(context)  # (the next merge's sum, taking results as they arrive)
        self.checks = ArrivalChecks(context, replays, lock=self.sums.lock, merge_soon=merge_soon,
                                    dropped=self._go_out_again)
        plan = context.session.plan
        self.copies = ArrivalCopies(context, book, self.checks, replays, choice, versions=self.versions, ban=ban,
                                    digest=lambda version: self.base_digest(version, self.versions.get(version)),
                                    job=lambda entry, version, deadline: jobs.job(
                                        entry_assignment(plan.schedule, plan.seed, entry, version), deadline),
                                    go_out_again=self._go_out_again)

    def units_open(self) -> int | None:
        """After a merge: as many held requests look for work as new units may go out before the buffer is
        ``BACKLOG_MERGES`` merges behind again (``behind``), and ``SPARE_TURNS`` more (a held unit's lease that ran
        out); the others hold on, or ask again when their hold ends. (Waking every one of 10,000 held requests after
        each merge cost the relay seconds of searches answered "wait".)"""
        if self.session.done:
            return None  # (every held request learns that the session is over)
        room = BACKLOG_MERGES * self.session.plan.participants_per_round - self.store.buffered_count()
        return max(room, 0) + SPARE_TURNS

    def start(self) -> None:
        """On start: results marked for merges the checkpoint lacks go back to the buffer; keep the weights. (A
        replica leaves the marks alone: the relay holding the session may be merging them.)"""
        if not self.context.replica:
            if returned := self.store.unmerge_from(self.session.round):
                self.store.count("arrivals_returned_to_buffer_on_start", returned)
        self.keep_version()
        self.sums.open_sum()
        self.copies.choice.restore()  # (the peers a copy confirmed keep their record)

    def restarted(self) -> None:
        self.copies.restore()

    def follow(self, older: dict[int, np.ndarray]) -> None:
        """The session moved on to a newer checkpoint another relay merged (a replica follows): keep its weights,
        and ``older``'s, the versions merged meanwhile that results may still start from."""
        for version, weights in older.items():
            self.versions[version] = weights
            self.digests[version] = weights, weights_sha256(weights)
        self.keep_version()
        self.sums.open_sum()

    def keep_version(self) -> None:
        """Remember the current weights (results started from them are judged against them) and forget
        versions past the staleness bound that no held arrival or dispute started from (their copies are judged
        against them: the merges do not wait for those, so the stream may move on many versions meanwhile)."""
        version = self.session.round
        self.versions[version] = self.session.weights.copy()
        self.digests[version] = self.versions[version], weights_sha256(self.versions[version])  # (results name it)
        needed = self.copies.versions_needed()
        for old in [v for v in self.versions if v < version - self.max_staleness and v not in needed]:
            self.versions.pop(old)
        self.digests = {v: named for v, named in self.digests.items() if self.versions.get(v) is named[0]}

    @property
    def max_staleness(self) -> int:
        return self.session.config.max_staleness

    # -- handing out ---------------------------------------------------------------------------------
    def next_job(self, peer_id: str) -> WorkAnswer:
        session, now, store = self.session, self.store.clock(), self.store
        job = self.jobs.job
        schedule = session.plan.schedule
        entry = self.holding.get(peer_id)  # the unit this peer is training
        if entry is not None:
            if store.shared:  # (another relay may have taken its result, or leased it anew: read afresh)
                held = None if store.has_arrived(entry) else store.lease(ASYNC_ROUND, entry)
            else:
                held = None if store.arrived(entry) else store.kept_lease(ASYNC_ROUND, entry)
            if held is not None and held.peer_id == peer_id and held.deadline >= now and held.version in self.versions:
                return job(entry_assignment(schedule, session.plan.seed, entry, held.version), held.deadline)
        self.holding.pop(peer_id, None)
        copy = self.copies.next_copy(peer_id)  # (before new units, and while they wait for merges)
        if copy is not None:
            return copy
        behind = self.behind()
        if behind is not None:
            return Wait(self.context.options.retry_seconds, behind)
        while self.next < len(schedule) and store.arrived(self.next):
            self.next += 1
        order, passed, tries = self.order, [], 0
        order.look(store, self.next, now)
        disputed = self.copies.in_dispute() if self.context.replica else frozenset()  # (the holder's to hand out)
        try:
            for entry in order.candidates(len(schedule)):
                if store.arrived(entry):
                    continue  # (its result is in: it never goes out again)
                lease = store.kept_lease(ASYNC_ROUND, entry)
                if lease is not None and lease.deadline >= now:
                    order.leased(entry, lease.deadline)  # (another relay leased it, or a lease was seen late)
                    continue
                if entry in disputed or self.book.refused(ASYNC_ROUND, entry, peer_id) and not self.book.refused_by_all(
                        ASYNC_ROUND, entry, store.active_peers(self.context.options.peer_timeout)):
                    passed.append(entry)  # (another connected peer may take it; when none may, the stream has
                    continue  # moved on: try again)
                tries += 1
                if lease is not None:
                    store.count("leases_expired")
                # (read once: a merge in its worker thread may move it on meanwhile; a disputed entry's is older)
                version = self.copies.version_for(entry, session.round)
                granted = store.grant(ASYNC_ROUND, entry, schedule[entry][1], peer_id,
                                      self.context.options.lease_seconds, version=version)
                if granted is None:  # (another relay over the store leased it, or took its result, a moment ago)
                    if tries >= GRANT_TRIES:
                        return Wait(self.context.options.retry_seconds, "other relays took the units tried")
                    continue
                order.leased(entry, granted.deadline)
                self.holding[peer_id] = entry
                self.context.notices.changed()
                return job(entry_assignment(schedule, session.plan.seed, entry, version), granted.deadline)
        finally:
            for entry in passed:
                order.give_back(entry)
        return Wait(self.context.options.retry_seconds, "every unit is out; waiting for results")

    def behind(self) -> str | None:
        """Why new units wait for merges (None: they do not). A relay that takes results faster than it merges them
        would fall further behind with every unit: the buffer and each result's staleness grow (past --max-staleness
        a result is refused, its work lost) while the merges, sharing the cores with taking results, slow down. So
        while ``BACKLOG_MERGES`` merges' results wait, a peer asking for a new unit waits for a merge. (Results held
        for a check count too: each merges once it passed, at the staleness the backlog lets it gather; their copies
        go out first, also meanwhile.)"""
        waiting, k = self.store.buffered_count(), self.session.plan.participants_per_round
        if waiting < BACKLOG_MERGES * k:
            return None
        return f"{waiting} results wait to be merged (at most {BACKLOG_MERGES * k} before new units go out)"

    # -- results ---------------------------------------------------------------------------------------
    def reader(self, peer_id: str, version: int, entry: int, body: bytes) -> Callable[[], EarlyRead] | None:
        """What of ``accept`` a worker thread may do as the result arrives: decode it against the weights it
        started from, its update and the update's norm (None: no kept weights to read it against)."""
        session, schedule = self.session, self.session.plan.schedule
        base = self.versions.get(version)
        if base is None and version == session.round:
            base = session.weights
        if base is None or not 0 <= entry < len(schedule):
            return None
        unit = session.work_unit(entry_assignment(schedule, session.plan.seed, entry, version))
        fingerprint, codec = self.context.package.fingerprint, session.config.result_codec

        digest, opened, sums = self.base_digest(version, base), self.sums.open, self.sums

        def read() -> EarlyRead:  # (the norm measured once, of the update the merge takes)
            outcome = read_parts(body, session=session, fingerprint=fingerprint, round_index=version, unit=unit,
                                 base=base, base_sha256=digest)
            if isinstance(outcome, Refusal):
                return EarlyRead(base, outcome)
            parts, count = outcome
            update = parts.update if parts.update is not None else update_of(body, parts.weights, base, codec)
            norm = float(np.linalg.norm(update.astype(np.float64)))
            return EarlyRead(base, (parts.header, parts.weights, count, norm), update=update,
                             contribution=sums.contribution(opened, update, version, count), digest=sha256_hex(body),
                             identity=parts.identity)
        return read

    def base_digest(self, version: int, base: np.ndarray | None) -> str | None:
        """The sha256 of ``base``, version ``version``'s weights, where it is kept (None: compute it)."""
        named = self.digests.get(version)
        return named[1] if named is not None and named[0] is base else None

    def accept(self, peer_id: str, version: int, entry: int, body: bytes,
               early: EarlyRead | None = None) -> StoredResult:
        session, options, now = self.session, self.context.options, self.store.clock()
        schedule = session.plan.schedule
        if session.done:
            raise Refusal(409, "stale_round", "the session is over")
        if not 0 <= entry < len(schedule):
            raise Refusal(404, "unknown_slot", f"the session has no unit entry {entry}")
        if self.store.arrived(entry):  # (a second copy of it, or a duplicate)
            base, assignment = self.versions.get(version), entry_assignment(schedule, session.plan.seed, entry, version)
            return self.copies.accept_copy(peer_id, version, entry, body,
                                           lambda: self._read(body, base, assignment, early)[:4],
                                           early.identity if early is not None else None)
        lease = self.store.kept_lease(ASYNC_ROUND, entry)
        if lease is None or lease.peer_id != peer_id or lease.version != version:  # (granted a moment ago by
            lease = self.store.lease(ASYNC_ROUND, entry)  # another relay, maybe to this peer again: read it afresh)
        if lease is None or lease.peer_id != peer_id or lease.version != version:
            raise Refusal(403, "not_leased", f"unit entry {entry} from version {version} is not leased to this peer")
        if lease.deadline < now:
            raise Refusal(409, "late", f"the lease on unit entry {entry} expired {now - lease.deadline:.1f} s ago")
        base = self.versions.get(version)
        if base is None and version == session.round:  # (a merge is storing this version right now)
            base = session.weights
        if base is None or session.round - version > self.max_staleness:
            raise Refusal(409, "too_stale", f"the result started from version {version}, {session.round - version} "
                          f"behind the current {session.round} (at most {self.max_staleness})")
        assignment = entry_assignment(schedule, session.plan.seed, entry, version)
        try:
            header, vector, count, norm, update = self._read(body, base, assignment, early)
            check_update_norm(norm, self.norms, max_norm=options.max_update_norm,
                              outlier_factor=options.outlier_factor, min_results=options.outlier_min_results)
            engine = str(header.meta.get("engine", ""))
            if (unjudgeable := self.replays.refusal(engine)) is not None:  # (copies here are not by engine class)
                raise self.replays.refuse_engine(peer_id, unjudgeable, engine)
        except Refusal:
            self.store.release(ASYNC_ROUND, entry)
            self.book.refuse(ASYNC_ROUND, entry, peer_id)
            self.store.count("slots_freed_by_refusal")
            self.context.notices.work_changed(available=1)  # (its unit goes to the next held request)
            raise
        self.norms = (self.norms + [norm])[-NORMS_KEPT:]
        self.people.note_unit(peer_id, now - lease.issued, engine)
        stored = StoredResult(version, entry, assignment.unit_index, peer_id, count, dict(header.metrics), b"", engine)
        quorum = self.copies.quorum(peer_id, version, entry, body, header.meta, vector)  # (an entry in dispute)
        if quorum == "copy":  # (it agrees with no result before it: kept with them, none merged)
            return stored
        try:
            seq = self.store.add_arrival(entry=entry, unit_index=assignment.unit_index, peer_id=peer_id,
                                         version=version, num_examples=count, metrics=dict(header.metrics),
                                         message=body, update=b"" if wire.is_update(body) else update.tobytes(),
                                         sha256=early.digest if early is not None else None)  # (stored_update)
        except AlreadyArrived as error:  # (its result reached another relay over the store a moment ago)
            raise Refusal(409, "duplicate", str(error)) from None
        early_part = None if early is None or early.base is not base else early.contribution
        replayed = self.checks.arrived(stored, seq, assignment, vector, base)  # (held: merged once it passed, the
        identity = None if early is None or early.identity is None else (engines_of(header.meta)[1], early.identity)
        copied = quorum != "settled" and self.copies.arrived(stored, seq, identity)  # merge adding it; or once its
        #   copy agreed)
        if not (replayed or copied):
            self.sums.add_on_arrival(seq, count, early_part)
        return stored

    def _read(self, body: bytes, base: np.ndarray | None, assignment: Assignment,
              early: EarlyRead | None) -> tuple[WireHeader, np.ndarray, int, float, np.ndarray]:
        """A result's header, weights, count, update norm and update, read against ``base`` (its version's weights;
        None: gone) as it arrived (``early``) or now."""
        session = self.session
        if base is None:
            raise Refusal(409, "too_stale", f"version {assignment.round} is no longer kept")
        if early is not None and early.base is base:  # (read as it arrived; its refusal raised here)
            header, vector, count, norm = early.answer()
            update = early.update if early.update is not None else \
                update_of(body, vector, base, session.config.result_codec)
            return header, vector, count, norm, update
        header, vector, count, _ = read_result(body, session=session, fingerprint=self.context.package.fingerprint,
                                               round_index=assignment.round, unit=session.work_unit(assignment),
                                               base=base)
        update = update_of(body, vector, base, session.config.result_codec)
        return header, vector, count, float(np.linalg.norm(update.astype(np.float64))), update

    def settle(self, verdicts: list[Verdict]) -> None:
        self.checks.settle(verdicts)
        self.copies.settle(verdicts)

    def banned(self, peer_id: str) -> None:
        self.checks.banned(peer_id)
        self.copies.banned(peer_id)

    def _go_out_again(self, entries: list[int]) -> None:
        """Entries whose result left the buffer (its peer was banned) go out again, first in schedule order."""
        self.next = min(self.next, *entries)
        for entry in entries:
            self.order.give_back(entry)

    def awaited(self, round_index: int, slot: int) -> bool:
        return slot in self.copies.waiting or slot in self.copies.disputes  # (``slot``: the schedule's entry)

    def holds_unit(self, peer_id: str, unit_index: int) -> bool:
        """Whether ``peer_id`` holds a live lease on ``unit_index`` in the stream (its unit's, or a copy's)."""
        return any(lease.peer_id == peer_id and lease.unit_index == unit_index and lease.deadline >= self.store.clock()
                   for copy in (0, 1) for lease in self.store.leases(ASYNC_ROUND, copy).values())

    def ready(self) -> bool:
        """K results that no check holds wait (the merge takes the oldest K of them: a result held for its replay or
        its copy joins a later merge once it passed, and the results behind it do not wait for it, unless a merge
        passed it over already: ``HELD_PASSES``), or the last ones of the session do, none held (never on a replica:
        the holding relay merges)."""
        if self.session.done or self.context.replica:
            return False
        waiting, k = self.store.buffered_count(), self.session.plan.participants_per_round  # (each poll: counts)
        if waiting - self.checks.held_count() >= k:  # (unless a held one was passed over enough: it goes first)
            overdue = self.checks.overdue()
            return not overdue or self.copies.waive(overdue) and not self.checks.overdue()
        if waiting < k and not (waiting > 0 and self.store.arrived_count() >= len(self.session.plan.schedule)):
            return False  # (fewer than K wait, and the session's last results are not all back)
        oldest = functools.partial(self.store.buffered_seqs, k)
        blocking = self.checks.blocks(oldest)  # (waiting for a replay or a copy: copies nobody may train are waived)
        return not blocking or self.copies.waive(blocking) and not self.checks.blocks(oldest)

    def merge_blocking(self) -> dict[str, Any]:
        """Merge the oldest K buffered results into the next version (runs in a worker thread)."""
        entry = merge_oldest(self.session, self.store, self.sums, self.checks)
        self.keep_version()
        self.sums.open_sum()
        return entry

    def waiting(self) -> str | None:
        """What the stream waits for, in words (None: a peer asking now is handed a unit)."""
        now, schedule = self.store.clock(), self.session.plan.schedule
        done = self.store.arrived_entries()
        out = sum(1 for entry, lease in self.store.leases(ASYNC_ROUND).items()
                  if entry not in done and lease.deadline >= now)
        unsent = len(schedule) - len(done) - out
        behind = self.behind() if unsent > 0 else None
        if behind is not None:
            return behind
        if unsent > 0:
            if not self.store.active_peers(self.context.options.peer_timeout):
                return f"{unsent} unit{'s' if unsent > 1 else ''} wait for a peer (none is connected)"
            return None
        return f"every unit is out: waiting for {out} result{'s' if out > 1 else ''}" if out else None

    def progress(self) -> dict[str, int]:
        """The status's ``round_progress`` in async mode: results waiting in the buffer out of K (copies: leased)."""
        now = self.store.clock()
        return {"slots": self.session.plan.participants_per_round, "done": self.store.buffered_count(),
                "leased": sum(1 for lease in self.store.leases(ASYNC_ROUND).values() if lease.deadline >= now),
                "copies": len(self.store.leases(ASYNC_ROUND, 1)), "arrived": self.store.arrived_count(),
                "units": len(self.session.plan.schedule)}

    def weights_of_version(self, version: int) -> bytes | None:
        """The wire message of a kept version (a peer asks for the weights its job names)."""
        weights = self.versions.get(version)
        return None if weights is None else self.jobs.message(weights, version)
