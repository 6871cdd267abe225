"""Second copies in async mode (``serve --mode async --redundancy F``): ``ArrivalCopies``, a part of the asynchronous
buffer (``server.relay.buffered``).

The results a copy checks are chosen as in rounds (``server.relay.copy_choice``: every result of a peer no copy has
confirmed yet, a share ``F`` of the others, or adaptive replication's record), as each arrives. A chosen arrival is held
out of the merges (``server.relay.arrival_checks``) until a second, different peer (another id and, with
``--ban-addresses``, another address) has trained the same schedule entry from the same version, and the two are
compared: identical from one engine class, or within the replay tolerance across engines where the task's training is
reproducible across them (else not comparable: it merges). Identical is decided without decoding: each result's
``wire.weights_identity`` (a sha256 of its payload and what it decodes against) is taken as it arrives, in a worker
thread, so an agreeing copy costs the event loop a comparison of two digests, not a read of the first result from the
store; where one is not known (held before a restart), by the bytes of both messages (``checks.compare_copy``). Copies
go out before new units, also while new units wait for merges (a merge takes the oldest K results no check holds:
a held arrival joins a later one, the next at the latest once a merge passed it over, and its version is kept
until its copy is judged). Copies that disagree go
to the host's replays where they can judge both engines (a failed one bans its peer: a ban drops its results still in
the buffer). Elsewhere (no replays, or results no replay can judge) neither is merged: the entry goes out again from the
same version to a third peer, and the first two results that agree settle it (``server.relay.arrival_quorum``). A
dispute whose version the buffer no longer keeps when the entry is handed out again ends without a ban (the entry starts
afresh). A held arrival whose copy no connected peer may train, or whose version is no longer kept, merges unchecked
(``copies_waived``).

What a peer can tell: a copy's job names the version its first result started from, which may be older than the
newest (a new unit starts from the newest), so a peer that tracks versions may guess that it trains a copy. That
tells it nothing about its own results: whether one of those is copied is decided when it arrives, in secret, and
every result of a peer is copied until a copy agreed with one. A replica hands out no copies of its own (the relay
holding the session decides), nor entries in dispute (a new unit of one would start from the newest version, where
no quorum can settle it). The store keeps what each held arrival waits for: after a restart (or a takeover) it waits
again where its version's weights are kept, else it leaves the buffer and its entry goes out again (``restore``).
The disputes are this relay's memory: after a restart a disputed entry goes out afresh (its liar is not banned,
and nothing of it merges).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.protocol import Job
from server.relay.arrival_checks import COPY, REPLAY, ArrivalChecks
from server.relay.arrival_quorum import Quorum
from server.relay.book import RoundBook
from server.relay.checks import (
    AGREE,
    Read,
    check_update_norm,
    compare_copy,
    decode_result,
    engines_of,
    identical_messages,
)
from server.relay.context import Part, RelayContext
from server.relay.copies import QUORUM_LIMIT
from server.relay.copy_choice import CopyChoice
from server.relay.refusal import Refusal
from server.relay.replay_checks import ReplayChecks, passed
from server.relay.store import Lease, StoredResult
from server.relay.store.records import ASYNC_ROUND, sha256_hex
from server.relay.verify import DISPUTE, Verdict
from server.session.buffered import entry_assignment

LOG = logging.getLogger("peertrain.relay")
RESTARTED = "held when the relay stopped"  # (the reason of a replay a restart runs again)
ACTIVE_KEPT_SECONDS = 1.0  # how long ``waive`` keeps who is connected


@dataclass
class Waiting:
    """An arrival held for its copy: its peer, the version it started from, its arrival number."""

    peer_id: str
    version: int
    seq: int
    judged: bool = False  # its copy disagreed and a host replay judges both
    identity: tuple[str, str] | None = None  # (its engine class and weights identity, where read as it arrived)


@dataclass
class Dispute:
    """An entry whose results disagree, none merged: the version they started from and their peers (each message
    kept as a copy of round -1 until a quorum settles it)."""

    version: int
    peers: list[str] = field(default_factory=list)


class ArrivalCopies(Part):
    """Which arrivals wait for a copy (``waiting``, by entry), handing the copies out, comparing them, and the
    entries in dispute (``disputes``). ``job``: an entry's job from a version until a deadline; ``versions``: the
    weights of the versions kept (the buffer's), ``digest`` their sha256 where known; ``ban``: the relay's ban;
    ``go_out_again``: entries the stream hands out again."""

    def __init__(self, context: RelayContext, book: RoundBook, checks: ArrivalChecks, replays: ReplayChecks,
                 choice: CopyChoice, *, versions: dict[int, np.ndarray], digest: Callable[[int], str | None],
                 job: Callable[[int, int, float], Job], ban: Callable[[str, str], None],
                 go_out_again: Callable[[list[int]], None]) -> None:
        self.context, self.book, self.checks, self.replays = context, book, checks, replays
        self.versions, self.digest, self.job, self.ban, self.go_out_again = versions, digest, job, ban, go_out_again
        self.choice = choice  # (the relay's: rounds and the stream keep one record of confirmed peers)
        self.quorums = Quorum(context, choice, versions=versions, digest=digest, ban=ban)
        self.waiting: dict[int, Waiting] = {}
        self.disputes: dict[int, Dispute] = {}
        self._active: tuple[float, list[str]] = (-math.inf, [])  # (when read, the connected peers)

    # -- an arrival ------------------------------------------------------------------------------------
    def arrived(self, stored: StoredResult, seq: int, identity: tuple[str, str] | None = None) -> bool:
        """An accepted arrival: held for a copy where the choice says so (``identity``: its engine class and
        ``wire.weights_identity``, which the copy is compared by). Whether it is held."""
        entry = stored.slot
        self.choice.note_result(ASYNC_ROUND, entry, stored.peer_id)
        if self.context.replica or not self.choice.redundant(ASYNC_ROUND, entry):
            return False
        self.waiting[entry] = Waiting(stored.peer_id, stored.round, seq, identity=identity)
        self.checks.hold((entry, stored.peer_id), seq, COPY)
        self.context.notices.work_changed(available=1)  # (its copy, for a held request)
        return True

    def restore(self) -> None:
        """On start: the arrivals a check held when the relay stopped (the store keeps what each waits for) wait for
        it again where their version's weights are kept (a copy goes out again, a replay runs again); the others
        leave the buffer, their entries go out again: nothing held merges unchecked because the relay restarted."""
        for seq, entry, peer_id, version, waiting in self.store.held_arrivals():
            found = self.store.unmerged_arrival(entry)
            if found is None or found[0] != peer_id:
                continue
            if version not in self.versions or self.store.ban_reason(peer_id):
                self.store.unmerged_arrival(entry, take=True)
                self.checks.drop((entry, peer_id))
                self.store.count("held_arrivals_out_again_on_start")
                self.go_out_again([entry])
                continue
            if REPLAY in waiting and self.replays.queue is None:  # (the host's replays were turned off since)
                waiting = waiting - {REPLAY}
                self.store.hold_arrival(entry, peer_id, waiting)
            if COPY in waiting:
                self.choice.note_result(ASYNC_ROUND, entry, peer_id)
                self.waiting[entry] = Waiting(peer_id, version, seq)
                self.checks.hold((entry, peer_id), seq, COPY)
            if REPLAY in waiting:
                base = self.versions[version]
                header, vector = decode_result(found[1], session=self.session, round_index=version, base=base)
                self.checks.hold((entry, peer_id), seq, REPLAY)
                self.replays.replay_arrival(entry_assignment(self.session.plan.schedule, self.session.plan.seed,
                                                             entry, version), base, {peer_id: vector}, RESTARTED,
                                            ("arrival", entry, peer_id), {peer_id: engines_of(header.meta)[0]})
            if waiting:
                self.store.count("held_arrivals_held_again_on_start")

    def banned(self, peer_id: str) -> None:
        """A banned peer's arrivals left the buffer (``ArrivalChecks.banned``): none of them waits for a copy."""
        for entry in [entry for entry, waiting in self.waiting.items() if waiting.peer_id == peer_id]:
            self.waiting.pop(entry)
            self.store.release(ASYNC_ROUND, entry)  # (its copy's lease: that copy is not needed)

    # -- handing copies out ----------------------------------------------------------------------------
    def next_copy(self, peer_id: str) -> Job | None:
        """A copy for ``peer_id``: the one it holds and has not delivered, else the oldest held arrival's that it
        may train and nobody holds, else an entry in dispute it may train (from the dispute's version: these go out
        before new units too, which may wait for merges), or None."""
        return self._held_copy(peer_id) or self._disputed(peer_id) if self.waiting or self.disputes else None

    def _held_copy(self, peer_id: str) -> Job | None:
        if not self.waiting:
            return None
        now, leases = self.store.clock(), self.store.leases(ASYNC_ROUND, 1)  # (read once an ask: many may wait)
        held = self._held_by(peer_id, now, leases, lambda entry: None if (waiting := self.waiting.get(entry)) is None
                             or waiting.judged else waiting.version)
        if held is not None:
            return held
        for entry, waiting in self.waiting.items():
            lease = leases.get(entry)
            if waiting.judged or lease is not None and lease.deadline >= now:
                continue
            if waiting.version not in self.versions or not self._eligible(peer_id, entry, waiting.peer_id):
                continue
            unit_index = self.session.plan.schedule[entry][1]
            granted = self.store.grant(ASYNC_ROUND, entry, unit_index, peer_id, self.options.lease_seconds, copy=1,
                                       version=waiting.version)
            if granted is not None:  # (None: another relay over the store leased it a moment ago)
                self.store.count("copies_handed_out")
                return self.job(entry, waiting.version, granted.deadline)
        return None

    def _disputed(self, peer_id: str) -> Job | None:
        now, expired = self.store.clock(), []
        leases = {entry: self.store.kept_lease(ASYNC_ROUND, entry) for entry in self.disputes}
        held = self._held_by(peer_id, now, leases, lambda entry: None if self.store.arrived(entry) else
                             self.disputes[entry].version)
        if held is not None:
            return held
        try:
            for entry, dispute in self.disputes.items():
                if dispute.version not in self.versions:
                    expired.append(entry)
                    continue
                lease = leases[entry]
                if self.store.arrived(entry) or lease is not None and lease.deadline >= now:
                    continue
                if not all(self._eligible(peer_id, entry, peer) for peer in dispute.peers):
                    continue
                granted = self.store.grant(ASYNC_ROUND, entry, self.session.plan.schedule[entry][1], peer_id,
                                           self.options.lease_seconds, version=dispute.version)
                if granted is not None:
                    self.store.count("disputes_handed_out")
                    return self.job(entry, dispute.version, granted.deadline)
            return None
        finally:
            for entry in expired:
                self.version_for(entry, -1)  # (its version is gone: it ends unsettled)

    def _held_by(self, peer_id: str, now: float, leases: Mapping[int, Lease | None],
                 version_of: Callable[[int], int | None]) -> Job | None:
        """The copy ``peer_id`` holds among ``leases`` (by entry) and asks for again, its job again (never a second
        one beside it): a live lease from the version the entry goes out from (``version_of``: None, not any more)."""
        for entry, lease in leases.items():
            if lease is not None and lease.peer_id == peer_id and lease.deadline >= now and \
                    lease.version == version_of(entry):
                return self.job(entry, lease.version, lease.deadline)
        return None

    def versions_needed(self) -> set[int]:
        """The versions the held arrivals and the disputes started from: their copies are judged against them. (Read
        by the merge's thread: a snapshot of each dict's values, which the event loop changes.)"""
        return {waiting.version for waiting in list(self.waiting.values())} | \
            {dispute.version for dispute in list(self.disputes.values())}

    def in_dispute(self) -> frozenset[int]:
        """The entries in dispute as the store has them (copies kept "unresolved"): a replica's view, which must not
        hand them out as new units (from its newest version: the dispute would never settle)."""
        return frozenset(entry for (entry, _), outcome in self.store.copies(ASYNC_ROUND).items()
                         if outcome == "unresolved")

    def _eligible(self, peer_id: str, entry: int, original: str) -> bool:
        """Whether ``peer_id`` may train the copy of ``entry``, whose first result came from ``original``."""
        if peer_id == original or self.book.refused(ASYNC_ROUND, entry, peer_id) or self.store.ban_reason(peer_id):
            return False
        return not self.options.ban_addresses or self.store.peer_address(peer_id) != self.store.peer_address(original)

    def waive(self, blocking: set[int]) -> bool:
        """Held arrivals the next merge would take (``blocking``: their arrival numbers) whose copy is not out and
        that no connected peer may train (or whose version is gone) merge unchecked; whether any did. Who is
        connected is read once a second at most (every poll of a crowd asks, and that is a read of every peer)."""
        now, waived = self.store.clock(), False
        for entry, peer_id in self.checks.keys_of(sorted(blocking)):  # (the K oldest at most, not every one held)
            waiting = self.waiting.get(entry)
            if waiting is None or waiting.peer_id != peer_id or waiting.seq not in blocking or waiting.judged:
                continue
            lease = self.store.kept_lease(ASYNC_ROUND, entry, 1)
            if lease is not None and lease.deadline >= now:
                continue
            if waiting.version in self.versions:
                if now - self._active[0] >= ACTIVE_KEPT_SECONDS:
                    self._active = now, self.store.active_peers(self.options.peer_timeout)
                if any(self._eligible(peer, entry, waiting.peer_id) for peer in self._active[1]):
                    continue
            self.waiting.pop(entry)
            self.store.count("copies_waived")
            self.store.set_verification(ASYNC_ROUND, entry, waiting.peer_id, "copy waived (no peer to train it)")
            self.checks.release([(entry, waiting.peer_id)], COPY)
            waived = True
        return waived

    def version_for(self, entry: int, current: int) -> int:
        """The version ``entry`` goes out from: its dispute's, while the buffer keeps it (a third result must start
        where the two that disagree did), else ``current`` (the dispute ends unsettled, nobody banned)."""
        dispute = self.disputes.get(entry)
        if dispute is None:
            return current
        if dispute.version in self.versions:
            return dispute.version
        self.disputes.pop(entry)
        for peer in dispute.peers:
            self.store.set_copy_outcome(ASYNC_ROUND, entry, peer, "expired")
        self.store.count("disputes_expired")
        return current

    # -- a second result -------------------------------------------------------------------------------
    def accept_copy(self, peer_id: str, version: int, entry: int, body: bytes, read: Callable[[], Read],
                    identity: str | None = None) -> StoredResult:
        """A result of an entry that has its arrival: the copy leased to ``peer_id``, compared with the arrival.
        ``read``: the copy's header, weights, count and norm against its version (raises a ``Refusal``);
        ``identity``: its ``wire.weights_identity`` where read as it arrived."""
        lease = self.store.lease(ASYNC_ROUND, entry, 1)
        if lease is None or lease.peer_id != peer_id or lease.version != version:
            raise Refusal(409, "duplicate", f"unit entry {entry} already has a result")
        waiting = self.waiting.get(entry)
        if waiting is None or waiting.version != version or waiting.judged:
            self.store.release(ASYNC_ROUND, entry, peer_id)
            raise Refusal(409, "past_deadline", f"unit entry {entry}'s first result is merged or judged: its second "
                          "copy is not needed any more")
        now = self.store.clock()
        try:
            if version not in self.versions:
                raise Refusal(409, "too_stale", f"version {version} is no longer kept")
            if lease.deadline < now:
                raise Refusal(409, "late", f"the lease on unit entry {entry} expired {now - lease.deadline:.1f} s ago")
            header, vector, count, norm = read()
            check_update_norm(norm, [], max_norm=self.options.max_update_norm, outlier_factor=0, min_results=1)
        except Refusal:
            self.store.release(ASYNC_ROUND, entry, peer_id)
            self.book.refuse(ASYNC_ROUND, entry, peer_id)
            raise
        base = self.versions[version]
        engine, engine_class = engines_of(header.meta)
        if identity is not None and waiting.identity is not None and identical_messages(
                self.session.task, (engine_class, identity), waiting.identity):  # (the first is not read again)
            outcome, first, found = "identical", vector, None
        else:
            found = self.store.unmerged_arrival(entry)
            assert found is not None and found[0] == waiting.peer_id, f"unit entry {entry} has no held arrival"
            outcome, first, first_engine, first_class = compare_copy(
                self.session, self.options, (engine_class, body, vector), found[1], round_index=version, base=base,
                base_sha256=self.digest(version))
        self.store.count(f"copies_{outcome}")
        self.store.release(ASYNC_ROUND, entry, peer_id)
        stored = StoredResult(version, entry, self.session.plan.schedule[entry][1], peer_id, count,
                              dict(header.metrics), b"", engine)
        if outcome != "disputed":  # (nothing reads an agreeing copy's bytes again: its digest kept, 2.5 ms saved)
            self.store.add_copy(ASYNC_ROUND, entry, peer_id, b"" if outcome in AGREE else body, outcome,
                                sha256=sha256_hex(body))
            if outcome in AGREE:
                self.choice.confirm(waiting.peer_id, peer_id)
            self.store.set_verification(ASYNC_ROUND, entry, waiting.peer_id, f"copy {outcome} (from {peer_id})")
            self.waiting.pop(entry)
            self.checks.release([(entry, waiting.peer_id)], COPY)
            return stored
        LOG.warning("copies of unit entry %d (version %d) disagree: first from %s (%s), copy from %s (%s)", entry,
                    version, waiting.peer_id, first_class, peer_id, engine_class)
        engines = {waiting.peer_id: first_engine, peer_id: engine}
        if self.replays.active and all(self.replays.judges(named) for named in engines.values()):
            self.store.add_copy(ASYNC_ROUND, entry, peer_id, body, "disputed")
            waiting.judged = True
            assignment = entry_assignment(self.session.plan.schedule, self.session.plan.seed, entry, version)
            self.replays.replay_arrival(assignment, base, {waiting.peer_id: first, peer_id: vector}, DISPUTE,
                                        ("arrival dispute", entry), engines)
            return stored
        self.store.count("disputes_unresolved")
        assert found is not None  # (read: identities say only "identical")
        self.undecided(entry, version, {waiting.peer_id: found[1], peer_id: body}, first_peer=waiting.peer_id)
        return stored

    def undecided(self, entry: int, version: int, messages: dict[str, bytes], *, first_peer: str | None) -> None:
        """Results of ``entry`` that disagree (``messages``, by peer): none merged, each kept as a copy; the entry
        goes out again from ``version`` to a peer that has not trained it."""
        if first_peer is not None:  # (the arrival held for its copy leaves the buffer)
            self.store.unmerged_arrival(entry, take=True)
            self.checks.drop((entry, first_peer))
            self.waiting.pop(entry, None)
        dispute = self.disputes.setdefault(entry, Dispute(version))
        for peer, message in messages.items():
            self.store.add_copy(ASYNC_ROUND, entry, peer, message, "unresolved", count_unit=peer != first_peer)
            dispute.peers.append(peer)
        self.book.refuse(ASYNC_ROUND, entry, *messages)
        self.store.release(ASYNC_ROUND, entry)
        if len(dispute.peers) >= QUORUM_LIMIT:
            self.store.count("quorums_without_majority")
            self.disputes.pop(entry)  # (it starts afresh)
        self.go_out_again([entry])
        self.context.notices.work_changed(available=1)

    def quorum(self, peer_id: str, version: int, entry: int, body: bytes, meta: Mapping[str, Any],
               vector: np.ndarray) -> str | None:
        """A result of an entry in dispute (None: it is not, or this result started elsewhere): ``"copy"`` when it
        agrees with none of the results before it (kept with them; the entry goes out once more), ``"settled"`` when
        it agrees with one (every other peer on the entry is banned; this result goes into the buffer, checked)."""
        dispute = self.disputes.get(entry)
        if dispute is None or dispute.version != version:
            return None
        if peer_id in dispute.peers:
            self.store.release(ASYNC_ROUND, entry, peer_id)
            raise Refusal(409, "duplicate", f"this peer's result of unit entry {entry} is in already")
        if not self.quorums.settle(dispute.peers, peer_id, version, entry, body, meta, vector):
            self.undecided(entry, version, {peer_id: body}, first_peer=None)
            return "copy"
        self.disputes.pop(entry)
        return "settled"

    def settle(self, verdicts: list[Verdict]) -> None:
        """A dispute's replay judged both results (``Relay.apply_verdicts`` banned whoever failed, which dropped a
        failed first result from the buffer): a first result still held merges."""
        for verdict in verdicts:
            if verdict.reason != DISPUTE:
                continue
            entry = verdict.slot  # (a copy's row; the first result's peer has none)
            outcome = "upheld" if verdict.ok else "unjudged" if verdict.error else "lied"
            self.store.set_copy_outcome(ASYNC_ROUND, entry, verdict.peer_id, outcome)
            waiting = self.waiting.get(entry)
            if waiting is not None and waiting.judged and verdict.peer_id == waiting.peer_id:
                self.store.set_verification(ASYNC_ROUND, entry, verdict.peer_id, "copy disputed, " + (
                    f"replay not run: {verdict.error[:200]}" if verdict.error else passed(verdict)))
                self.waiting.pop(entry)  # (passed, or the host could not replay it: no verdict on anyone)
                self.checks.release([(entry, waiting.peer_id)], COPY)
