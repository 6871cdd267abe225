"""The relay's state: hands out work, checks every result, merges, validates and checkpoints (via ``Session``).

``Relay`` owns the session being served, its SQLite store and the events that wake held requests and the
page's event streams; the endpoints (``server.relay.endpoints``) change it only through its public methods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime import wire
from runtime.tasks import UnitResult
from server.relay.admin import SessionAdmin
from server.relay.admission import JoinLimiter
from server.relay.buffered import ASYNC_ROUND, BufferedMerges
from server.relay.checks import check_update_norm, describe_defenses, read_result
from server.relay.copies import UnitCopies
from server.relay.options import RelayOptions
from server.relay.pacing import RoundPacing
from server.relay.people import Participants
from server.relay.refusal import Refusal
from server.relay.replay_checks import ReplayChecks
from server.relay.sqlite_store import Store, StoredResult
from server.relay.storage import StorageGuard, is_storage_error
from server.relay.verify import ReplayQueue
from server.session.package import Package
from server.session.session import Session

MAX_HOLD_SECONDS = 20.0  # longest a POST /api/work?hold=S request is held
HANDOUT_TURNS = 3  # event-loop turns given to woken held requests after a merge (each answers in one or two)
UNIT_TIMES_KEPT = 50  # merged units whose hand-out-to-result time sets the backups' yardstick
HISTORY_LENGTH = 200  # rounds of history in the status (the page's chart); the full history is exported
RESULT_ENVELOPE_BYTES = 16  # a result body may exceed its payload and header by the wire's length fields


@dataclass
class Relay(UnitCopies, RoundPacing, BufferedMerges, SessionAdmin, Participants, ReplayChecks, StorageGuard):
    session: Session
    package: Package
    store: Store
    options: RelayOptions
    paused: bool = False
    version: int = 0
    merging: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _work_event: asyncio.Event = field(default_factory=asyncio.Event)
    _merge_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _weights_cache: tuple[int, bytes] | None = None
    # (round, slot) -> the accepted result (message dropped) and its decoded weights, until the round merges
    _decoded: dict[tuple[int, int], tuple[StoredResult, np.ndarray]] = field(default_factory=dict)
    latest_samples: list[dict[str, Any]] = field(default_factory=list)
    samples_round: int | None = None  # rounds merged into the weights latest_samples come from
    _background: set[asyncio.Task[None]] = field(default_factory=set)  # the loop keeps only weak references
    # Per round: the accepted updates' norms (the relative check), and the peers refused on each slot, which
    # are not handed that slot again (an honest peer takes it at once instead of after the lease).
    _accepted_norms: dict[int, list[float]] = field(default_factory=dict)
    _refused_on_slot: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    joins: JoinLimiter = field(init=False)
    replays: ReplayQueue | None = None  # None: verification is off
    _replay_wait: float = 0.0  # how long the last merge waited for its round's replays (its added time)
    _unit_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=UNIT_TIMES_KEPT))
    _backups: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    storage: dict[str, Any] = field(default_factory=dict)  # disk use, measured after each merge

    def __post_init__(self) -> None:
        self.joins = JoinLimiter(self.options.join_rate, self.options.join_burst)
        self._start_replays()
        released = self.store.release_live_leases()
        if released:
            self.store.count("leases_released_on_start", released)
        if not self.session.done and not self.async_mode:
            self.settle_after_restart()
        self.start_async()
        self.measure_storage()

    # -- state the page and the CLI see ---------------------------------------------------------
    @property
    def min_peers(self) -> int:
        return self.options.min_peers or min(self.session.plan.participants_per_round, self.session.plan.num_units)

    def status(self) -> dict[str, Any]:
        session = self.session
        active = self.store.active_peers(self.options.peer_timeout)
        slots = [] if session.done else session.assignments()
        results = self.store.result_slots(session.round) if not session.done else set()
        leases = self.store.leases(session.round) if not session.done else {}
        now = self.store.clock()
        return {
            **session.describe(),
            "task": session.task.describe(),
            "fingerprint": self.package.fingerprint,
            "paused": self.paused,
            "merging": self.merging,
            "peers": {"connected": len(active), "joined": self.store.peer_count(), "needed": self.min_peers,
                      "addresses": self.store.addresses(self.options.peer_timeout)},
            "round_progress": {"slots": len(slots), "done": len(results),
                               "leased": sum(1 for s, lease in leases.items() if s not in results
                                             and lease.deadline >= now),
                               "copies": sum(1 for lease in (self.store.leases(session.round, 1).values()
                                                             if not session.done else ())
                                             if lease.deadline >= now)} if not self.async_mode
            else self.async_progress(),
            "mode": session.config.mode,
            "history": session.history[-HISTORY_LENGTH:],
            "initial_metrics": session.initial_metrics,
            "samples": self.latest_samples,
            "samples_round": self.samples_round,
            "counters": self.store.counters(),
            "defenses": self.defenses(),
            "participants": self.participants(),
            "public_model": self.options.public_model,
            "storage": self.storage,
            "version": self.version,
        }

    def defenses(self) -> dict[str, Any]:
        """What this session defends against and what it does not, in words for the page."""
        return describe_defenses(self.options, self.session.aggregator.name, self.session.aggregator.to_config(),
                                 self.session.task.kind)

    def start_session(self, session: Session, store: Store) -> None:
        """Serve ``session`` (with its own store) from now on, forgetting what belonged to the previous one."""
        self.session, self.store = session, store
        self.paused = False
        self.latest_samples, self.samples_round = [], None
        self._weights_cache = None  # (the caller announces the change: this may run in a worker thread)
        self._decoded = {}
        self.__dict__.pop("_async", None)
        self._start_replays()
        self.start_async()
        self.measure_storage()

    def open(self) -> None:
        """(Re)open the store: the app's lifespan calls this on start-up, ``close`` on shutdown."""
        self.store.open()

    def close(self) -> None:
        if self.replays is not None:
            self.replays.verifier.close()
        self.store.close()

    # -- limits peers follow -------------------------------------------------------------------------
    @property
    def max_hold_seconds(self) -> float:
        """The longest a ``POST /api/work?hold=S`` is held: half the peer timeout keeps a held peer connected."""
        return min(MAX_HOLD_SECONDS, self.options.peer_timeout / 2)

    @property
    def result_body_limit(self) -> int:
        return self.session.spec.size * 4 + wire.MAX_HEADER_BYTES + RESULT_ENVELOPE_BYTES

    def peer_limits(self) -> dict[str, float]:
        """What a peer should know of the relay's limits (``GET /api/task``'s ``limits``)."""
        return {"hold_seconds": self.max_hold_seconds, "lease_seconds": self.options.lease_seconds,
                "peer_timeout": self.options.peer_timeout, "result_bytes": self.result_body_limit}

    def changed(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def work_changed(self) -> None:
        """Something that can turn a "wait" into work happened (a round opened, a peer joined, an admin
        action): wake the peers holding ``POST /api/work?hold=S``. Lease expiry wakes nobody; holders see it
        when their hold ends."""
        self._work_event.set()
        self._work_event = asyncio.Event()
        self.changed()

    async def wait_for_change(self, seconds: float) -> bool:
        """Wait until the next ``changed`` (True) or ``seconds`` (False): what an event stream waits on."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            return False
        return True

    async def hold_for_work(self, seconds: float) -> None:
        """Return after ``work_changed`` or ``seconds``, whichever comes first."""
        try:
            await asyncio.wait_for(self._work_event.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            pass

    # -- admission ---------------------------------------------------------------------------------
    def admit(self, address: str) -> None:
        """Refuse a join from ``address`` past its join rate or its cap of live peers (429, ``Retry-After``),
        or from the address of a banned peer (403 ``banned``)."""
        if self.options.ban_addresses and self.store.address_banned(address):
            raise Refusal(403, "banned", f"a peer from {address} was banned from this session for a result that "
                          "failed verification")
        cap = self.options.max_peers_per_address
        if cap > 0 and self.store.live_peers_at(address, self.options.peer_timeout) >= cap:
            raise Refusal(429, "too_many_peers", f"{address} already has {cap} live peers in this session",
                          headers={"Retry-After": str(max(1, int(self.options.peer_timeout)))})
        self.joins.admit(address)

    # -- handing out work -----------------------------------------------------------------------
    def next_assignment(self, peer_id: str) -> dict[str, Any]:
        session = self.session
        if session.done:
            return {"done": True, "reason": session.stopped or "the session is complete"}
        self.refuse_while_full()
        if self.async_mode and not self.paused:  # peers never wait for a round (server.relay.buffered)
            return self.next_async(peer_id, self._assignment_json)
        if self.paused or self.merging:
            return {"wait": self.options.retry_seconds, "reason": "paused" if self.paused else "merging the round"}
        results, leases = self.store.result_slots(session.round), self.store.leases(session.round)
        now = self.store.clock()
        mine = [(s, lease) for s, lease in self.store.leases(session.round, 1).items()
                if lease.peer_id == peer_id and lease.deadline >= now]
        if mine:  # this peer trains a second copy (server.relay.copies)
            copy = self.next_copy(peer_id)
            if copy is not None:
                return copy
        started = bool(results) or bool(leases)
        connected = len(self.store.active_peers(self.options.peer_timeout))
        if not started and connected < self.min_peers:
            missing = self.min_peers - connected
            return {"wait": self.options.retry_seconds,
                    "reason": f"waiting for {missing} more peer{'s' if missing > 1 else ''} to start round "
                              f"{session.round + 1} ({connected}/{self.min_peers} connected)"}
        open_slots = []
        for assignment in session.assignments():
            if assignment.slot in results:
                continue
            lease = leases.get(assignment.slot)
            if lease is not None and lease.deadline >= now:
                if lease.peer_id == peer_id:
                    return self._assignment_json(assignment, lease.deadline)
                continue
            if peer_id in self._refused_on_slot.get((session.round, assignment.slot), ()):
                continue
            open_slots.append((assignment, lease))
        if not open_slots:
            copy = self.next_copy(peer_id)
            if copy is not None:
                self.changed()
                return copy
            return {"wait": self.options.retry_seconds,
                    "reason": f"round {session.round + 1}: waiting for other peers' units"}
        assignment, expired = open_slots[0]
        if expired is not None:
            self.store.count("leases_expired")
        lease = self.store.grant(session.round, assignment.slot, assignment.unit_index, peer_id,
                                 self.options.lease_seconds)
        if not started:
            self.watch_deadline()
        self.prepare_replay(peer_id, assignment.slot)
        self.changed()
        return self._assignment_json(assignment, lease.deadline)

    def holds_unit(self, peer_id: str, unit_index: int) -> bool:
        """Whether ``peer_id`` holds a live lease on ``unit_index`` in the current round."""
        now = self.store.clock()
        rounds = (ASYNC_ROUND,) if self.async_mode else (self.session.round,)
        return any(lease.peer_id == peer_id and lease.unit_index == unit_index and lease.deadline >= now
                   for r in rounds for copy in (0, 1) for lease in self.store.leases(r, copy).values())

    def _assignment_json(self, assignment: Any, deadline: float) -> dict[str, Any]:
        unit = self.session.work_unit(assignment)
        return {**assignment.to_json(), "kind": self.session.task.kind, "episodes": unit.episodes,
                "progress": unit.progress,
                "lease_deadline": deadline, "lease_seconds": max(0.0, deadline - self.store.clock()),
                "weights_round": assignment.round, "num_rounds": self.session.num_rounds,
                "fingerprint": self.package.fingerprint,
                **({"carried_from": carried} if (carried := self.session.carried_from(assignment)) is not None
                   else {})}

    def weights_message(self) -> bytes:
        if self._weights_cache is None or self._weights_cache[0] != self.session.round:
            header = wire.WireHeader(spec=self.session.spec, round=self.session.round,
                                     fingerprint=self.package.fingerprint, num_examples=0)
            self._weights_cache = (self.session.round, wire.encode(self.session.weights, header))
        return self._weights_cache[1]

    # -- checking and merging results -----------------------------------------------------------
    def accept_result(self, peer_id: str, round_index: int, slot: int, body: bytes) -> StoredResult:
        """Check and store a result, keeping its decoded weights for the merge (saves reading them back).

        A result refused for what it holds (not for its lease) frees its slot at once for another peer. A
        result of a slot that has its merged result already is a second copy: compared, never merged."""
        if self.async_mode:
            return self.accept_async(peer_id, round_index, slot, body)
        assignment, second = self._leased_assignment(peer_id, round_index, slot)
        if second:
            return self.accept_copy(peer_id, round_index, slot, assignment, body)
        stored, vector, norm = self.check_result(peer_id, round_index, slot, body)
        self.store.add_result(stored)
        own, second_copy = self.store.leases(round_index).get(slot), self.store.leases(round_index, 1).get(slot)
        came_first = second_copy is not None and second_copy.peer_id == peer_id
        if came_first:  # the copy's result came first: the other one is the copy now
            self.store.swap_copies(round_index, slot)
        lease = second_copy if came_first else own
        if lease is not None:
            self.record_unit_time(round_index, slot, lease, backup_won=came_first and not self.redundant(
                round_index, slot))
            self.note_unit(peer_id, self.store.clock() - lease.issued, stored.engine)
        self._decoded[(round_index, slot)] = (dataclasses.replace(stored, message=b""), vector)
        self._accepted_norms.setdefault(round_index, []).append(norm)
        self.verify(stored, vector)
        return stored

    def check_result(self, peer_id: str, round_index: int, slot: int,
                     body: bytes) -> tuple[StoredResult, np.ndarray, float]:
        """The result as it would be stored (with the relay's example count), its decoded weights and its
        update norm; a ``Refusal`` names what is wrong (``server.relay.checks``)."""
        assignment, _ = self._leased_assignment(peer_id, round_index, slot)
        session = self.session
        try:
            header, vector, count, norm = read_result(body, session=session, fingerprint=self.package.fingerprint,
                                                      round_index=round_index, unit=session.work_unit(assignment))
            check_update_norm(norm, self._accepted_norms.get(round_index, []),
                              max_norm=self.options.max_update_norm, outlier_factor=self.options.outlier_factor,
                              min_results=self.options.outlier_min_results)
        except Refusal as refusal:
            self._free_slot(peer_id, round_index, slot)
            if refusal.code == "num_examples_claim":  # an honest peer's runtime never claims more than it holds
                self.ban(peer_id, f"claimed more examples than its unit holds ({refusal.message})")
            elif refusal.code == "update_outlier":  # replay it: a cheat is banned, an unlucky peer is not
                self.verify(StoredResult(round_index, slot, assignment.unit_index, peer_id, 0, {}, b""),
                            wire.decode(body)[1], outlier=True)
            raise
        return StoredResult(round_index, slot, assignment.unit_index, peer_id, count, dict(header.metrics),
                            body, str(header.meta.get("engine", ""))), vector, norm

    def _leased_assignment(self, peer_id: str, round_index: int, slot: int) -> tuple[Any, bool]:
        """The slot's assignment, and whether this result is a second copy (the slot has its merged result)."""
        session = self.session
        if session.done or round_index != session.round:
            raise Refusal(409, "stale_round", f"round {round_index} is not the current round ({session.round})")
        by_slot = {a.slot: a for a in session.assignments()}
        if slot not in by_slot:
            raise Refusal(404, "unknown_slot", f"round {round_index} has no slot {slot}")
        leases = [lease for copy in (0, 1) if (lease := self.store.leases(round_index, copy).get(slot))
                  is not None and lease.peer_id == peer_id]
        author = self.store.result_peer(round_index, slot)
        has_result = author is not None
        if self.merging and not has_result:
            raise Refusal(409, "past_deadline", f"round {round_index + 1} passed its deadline and is merging without "
                          f"slot {slot}; the unit is trained again in the next round")
        if has_result and (not leases or author == peer_id or (slot, peer_id) in self.store.copies(round_index)):
            raise Refusal(409, "duplicate", f"slot {slot} of round {round_index} already has a result")
        if not leases:
            raise Refusal(403, "not_leased", f"slot {slot} of round {round_index} is not leased to this peer")
        deadline = max(lease.deadline for lease in leases)
        if deadline < self.store.clock():
            raise Refusal(409, "late", f"the lease on slot {slot} expired {self.store.clock() - deadline:.1f} s ago")
        return by_slot[slot], has_result

    def _free_slot(self, peer_id: str, round_index: int, slot: int) -> None:
        """After a refused result: release the lease, never hand this slot to that peer again this round."""
        self.store.release(round_index, slot)
        self._refused_on_slot.setdefault((round_index, slot), set()).add(peer_id)
        self.store.count("slots_freed_by_refusal")
        self.work_changed()

    def _forget_rounds_before(self, round_index: int) -> None:
        self._accepted_norms = {r: v for r, v in self._accepted_norms.items() if r >= round_index}
        self._refused_on_slot = {k: v for k, v in self._refused_on_slot.items() if k[0] >= round_index}
        if self.replays is not None:
            self.replays.forget_before(round_index)

    def complete_round_blocking(self) -> dict[str, Any]:
        """Merge the stored results of the current round (runs in a worker thread).

        The weights come from what ``accept_result`` kept; after a restart they are read back from SQLite.
        Nothing else writes results meanwhile: every slot of this round is full and the next is not open.
        """
        session, round_index = self.session, self.session.round
        slots = self.store.result_slots(round_index)
        kept = {slot: self._decoded.pop((round_index, slot)) for slot in slots if (round_index, slot) in self._decoded}
        if len(kept) < len(slots):
            for slot, result in self.store.results(round_index).items():
                if slot not in kept:
                    kept[slot] = (result, wire.decode(result.message, expect_spec=session.spec)[1])
        by_slot = {a.slot: a for a in session.assignments()}
        results = [(by_slot[slot], UnitResult(vector, result.num_examples, result.metrics))
                   for slot, (result, vector) in sorted(kept.items())]
        costs = self.replays.costs(round_index) if self.replays is not None else None
        extra: dict[str, Any] = {"verification": {**costs, "waited_seconds": self._replay_wait}} if costs else {}
        self._waiting_copies(count_waived=True)
        deadline = self.deadline_summary()
        if deadline is not None:
            extra["deadline"] = deadline
        redundancy, backups = self.redundancy_summary(round_index), self.backups_summary(round_index)
        if redundancy is not None:
            extra["redundancy"] = redundancy
        if backups is not None:
            extra["backups"] = backups
        return session.complete_round(results, extra=extra or None, carry_missing=True)

    def merge_and_prune(self) -> None:
        """The merge (a worker thread): checkpointed by ``Session``, then older messages pruned, disk measured."""
        if self.async_mode:
            self.complete_buffer_blocking()
        else:
            self.complete_round_blocking()
        self.prune_results()
        self.measure_storage()

    def samples_blocking(self, weights: np.ndarray) -> list[dict[str, Any]]:
        """The page's samples for ``weights`` (generating text can cost several validations)."""
        return [{"text": s.text, "ok": s.ok} for s in self.session.task.samples(weights, self.session.data.validation)]

    def round_full(self) -> bool:
        session = self.session
        return not session.done and len(self.store.result_slots(session.round)) >= len(session.assignments()) \
            and not self.copies_outstanding()

    def schedule_merge(self) -> None:
        """Run ``maybe_complete_round`` in the background, holding a reference until it is done."""
        task = asyncio.get_running_loop().create_task(self.maybe_complete_round())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def maybe_complete_round(self) -> None:
        async with self._merge_lock:
            session = self.session
            if not self.round_ready():
                return
            waited = time.perf_counter()
            await self.wait_for_replays(session.round)
            self._replay_wait = time.perf_counter() - waited
            if not self.round_ready():  # a replay banned a peer: its slots are out again
                return
            self.merging = True
            self.changed()
            try:
                await asyncio.to_thread(self.merge_and_prune)
            except Exception as error:  # (a checkpoint library may word a full disk in its own exception)
                if not is_storage_error(error):
                    raise
                self.merge_failed_on_storage(error)  # back to the last checkpoint; tried again when space returns
                return
            finally:
                self._forget_rounds_before(self.session.round)
                self.merging = False
                self.work_changed()
            # After the next round is open: peers train meanwhile; the lock keeps the next merge behind it.
            rounds, weights = session.round, session.weights
            if self.async_mode and not session.history[-1]["metrics"]:
                return  # (samples follow the validations)
            for _ in range(HANDOUT_TURNS):  # let the woken held requests take their units before the samples'
                await asyncio.sleep(0)      # thread starts competing with this loop for the GIL
            self.latest_samples = await asyncio.to_thread(self.samples_blocking, weights)
            self.samples_round = rounds
            self.changed()
