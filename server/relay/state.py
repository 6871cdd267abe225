"""The relay: hands out work, checks every result, merges, validates and checkpoints (via ``Session``).

``Relay`` is a small object that owns its parts, each behind its own interface:

    jobs          what a peer is handed: job JSON, weights messages (jobs.py)
    book          the open rounds' accepted results, norms and refused peers (book.py)
    people        the participants table (people.py)
    verification  host replays (replay_checks.py, verify.py)
    copies        redundancy and backups (copies.py)
    bans          bans and their effect on the open round (bans.py)
    undo          a ban merges the banned peer's rounds again without its results (undo.py)
    pacing        round deadlines (pacing.py)
    mode          a RoundMode (round_mode.py): SyncRounds (rounds.py) or AsyncBuffer (buffered.py, arrival_*.py)
    disk          pruning, disk use, a full disk (storage.py)
    admin         pause, resume, stop, a new session (admin.py)
    sharing       relays serving one session together: a replica follows the holder's checkpoints (sharing.py)
    merges        when a merge runs, the undos and replays before it, the samples after it (merge_schedule.py)
    report        the status the page and the CLI see, its events, what the session waits for (status.py)

and one transport-free API that every driver calls: the HTTP endpoints (``server.relay.endpoints``), the
virtual-clock simulator (``server.simulation.stragglers``), the benches and the tests:

    join(address, agent, join_code)           -> (peer_id, token)
    peer(peer_id, token)                      -> peer_id, or a Refusal (401 unauthorized, 403 banned)
    next_work(peer_id)                        -> a Job, a Wait or Done (``runtime.protocol``)
    await work(peer_id, token, hold=S)        the same, held up to S s until work exists (long polling)
    submit_result(peer_id, round, slot, body) -> the stored result, or a Refusal; counted either way
    merge_ready()                             merge every round that is ready, inline (a driver without a loop)
    await maybe_complete_round()              the same on the event loop, the merge in a worker thread

The relay counts what happens (``store.count``) and says so (``notices``); a driver only carries messages. On
an event loop merges are scheduled by the relay itself (``merge_soon``); a driver without one (the simulator)
calls ``merge_ready`` after each event. Parts that need another part are handed it when they are built (whether a
ban can be undone, which replays and undos both ask: ``undo_rules.py``); parts that need the round mode are handed
a way to read the current one, since a new session brings its own.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from runtime import wire
from runtime.protocol import Done, Wait, WorkAnswer
from server.relay.admin import SessionAdmin
from server.relay.admission import Admission
from server.relay.bans import Bans
from server.relay.book import RoundBook
from server.relay.buffered import AsyncBuffer
from server.relay.checks import EarlyRead
from server.relay.context import Notices, RelayContext
from server.relay.copies import UnitCopies
from server.relay.credit import Credit
from server.relay.jobs import Jobs
from server.relay.merge_schedule import MergeSchedule
from server.relay.options import RelayOptions
from server.relay.pacing import RoundPacing
from server.relay.people import Participants
from server.relay.refusal import Refusal
from server.relay.replay_checks import ReplayChecks
from server.relay.round_mode import RoundMode
from server.relay.rounds import SyncRounds
from server.relay.sharing import SharedServing
from server.relay.status import Samples, StatusReport
from server.relay.storage import StorageGuard, is_storage_error
from server.relay.store import Store, StoredResult
from server.relay.undo import BanUndo
from server.relay.undo_rules import UndoRules
from server.relay.uploads import Uploads
from server.relay.volunteers import VolunteerProof, Volunteers
from server.session.package import Package
from server.session.session import Session

MAX_HOLD_SECONDS = 20.0  # longest a POST /api/work?hold=S request is held
RESULT_ENVELOPE_BYTES = 16  # a result body may exceed its payload and header by the wire's length fields


@dataclass
class Relay:
    session: Session
    package: Package
    store: Store
    options: RelayOptions
    replica: bool = False  # another relay holds the session and merges (``server.relay.sharing``)
    context: RelayContext = field(init=False)
    departed: dict[str, float] = field(default_factory=dict)  # peers that left, and when (until they ask again)
    uploads: Uploads = field(default_factory=Uploads, init=False, repr=False)  # (``uploading``, ``submit``)

    def __post_init__(self) -> None:
        self.context = context = RelayContext(self.session, self.package, self.store, self.options,
                                              replica=self.replica)
        self.notices: Notices = context.notices
        self.admission = Admission(context)
        self.jobs = Jobs(context)
        self.volunteers = Volunteers(context)
        self.credit = Credit(context)
        self.people = Participants(context, credit=self.credit)
        undo_rules = UndoRules(context)
        self.verification = ReplayChecks(context, self.jobs, undo_rules=undo_rules, on_verdict=self.apply_verdicts)
        self.book = RoundBook(judges_direction=self.verification.judges_direction,
                              shared=lambda: self.store if self.store.shared else None)
        self.copies = UnitCopies(context, self.book, self.jobs, self.verification)
        self.undo = BanUndo(context, rules=undo_rules, book=self.book, jobs=self.jobs, replays=self.verification,
                            schedule=self.merge_soon)
        self.bans = Bans(context, self.book, self.copies, self.undo, on_unban=self._forget_record,
                         on_ban=lambda peer_id: self.mode.banned(peer_id))
        self.pacing = RoundPacing(context)
        self.disk = StorageGuard(context, serve_restored=self.serve_restored, retry_merge=self.merge_soon)
        self.samples = Samples()
        self.merges = MergeSchedule(context, mode=self.current_mode, book=self.book, replays=self.verification,
                                    undo=self.undo, pacing=self.pacing, disk=self.disk,
                                    apply_verdicts=self.apply_verdicts, samples=self.samples)
        self.admin = SessionAdmin(context, merge_lock=self.merges.lock, start_session=self.start_session)
        self.report = StatusReport(context, mode=self.current_mode, people=self.people, replays=self.verification,
                                   disk=self.disk, admin=self.admin, samples=self.samples)
        self.mode: RoundMode = self._make_mode()
        self.sharing = SharedServing(context, mode=self.current_mode, merges=self.merges, submit=self.submit,
                                     copies=self.copies)
        released = 0 if self.replica else self.store.release_live_leases()  # (a replica's peers hold theirs)
        if released:
            self.store.count("leases_released_on_start", released)
        self.undo.retain()
        if not self.replica:  # (an undo a restart interrupted, or asked for just before it, ends before hand-out)
            self.merges.undo_inline()
        if not self.session.done and not self.replica:  # (a replica decides none of it)
            self.mode.restarted()
        self.disk.measure()

    def _forget_record(self, peer_id: str) -> None:
        """A lifted ban: the trust the peer's passed replays and copies earned starts afresh."""
        self.verification.forget_record(peer_id)
        self.copies.choice.forget_record(peer_id)

    def _make_mode(self) -> RoundMode:
        """The session's round mode, started (a restarted async buffer takes back the arrivals its checkpoint lacks)."""
        if self.context.async_mode:
            buffer = AsyncBuffer(self.context, self.book, self.jobs, self.people, self.verification, self.merge_soon,
                                 ban=self.bans.ban, choice=self.copies.choice)
            buffer.start()
            return buffer
        return SyncRounds(self.context, book=self.book, jobs=self.jobs, people=self.people,
                          replays=self.verification, copies=self.copies, bans=self.bans, pacing=self.pacing,
                          on_round_opened=self.merges.watch_deadline)

    def current_mode(self) -> RoundMode:
        """The round mode of the session served now (what the parts that read the mode are handed)."""
        return self.mode

    def start_session(self, session: Session, store: Store, options: RelayOptions | None = None) -> None:
        """Serve ``session`` (with its own store, and ``options`` where the rules changed them) from now on,
        forgetting what belonged to the previous one. (The caller announces the change: this may run in a worker
        thread.)"""
        self.session = self.context.session = session
        self.store = self.context.store = store
        if options is not None:
            self.options = self.context.options = options
        self.samples.clear()
        self.jobs.forget()
        self.book.clear()
        self.verification.start()
        self.mode = self._make_mode()
        self.undo.retain()
        self.disk.measure()

    def open(self) -> None:
        """(Re)open the store: the app's lifespan calls this on start-up, ``close`` on shutdown."""
        self.store.open()

    def close(self) -> None:
        self.uploads.close()
        self.verification.close()
        self.store.close()
        self.session.round_log.close()  # (its metrics runs end: FINISHED if the session is done, else KILLED)

    # -- state the page and the CLI see ---------------------------------------------------------------------
    @property
    def async_mode(self) -> bool:
        return self.context.async_mode

    @property
    def merging(self) -> bool:
        return self.context.merging

    @property
    def paused(self) -> bool:
        return self.admin.is_paused()

    @property
    def replacing(self) -> bool:
        return self.admin.replacing

    @property
    def version(self) -> int:
        return self.notices.version

    def status(self) -> dict[str, Any]:
        return self.report.status()

    def waiting(self) -> str | None:
        return self.report.waiting()

    def status_event(self) -> str:
        return self.report.event()

    def defenses(self) -> dict[str, Any]:
        return self.report.defenses()

    # -- limits peers follow ----------------------------------------------------------------------------------
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

    # -- joining and who a request is from (server.relay.admission) ---------------------------------------
    def join(self, address: str, *, agent: str = "", join_code: str = "", ticket: str = "",
             engine_class: str = "", volunteer: VolunteerProof | None = None) -> tuple[str, str]:
        """A new peer's credentials (``server.relay.admission``); ``engine_class``: what it says it trains on;
        ``volunteer``: the proof of the key its page keeps (``server.relay.volunteers``), checked first."""
        if volunteer is not None:
            self.volunteers.prove(volunteer)
        peer_id, token = self.admission.join(address, agent=agent, join_code=join_code, ticket=ticket)
        if volunteer is not None:
            self.volunteers.attach(peer_id, volunteer)
        if engine_class:
            self.verification.classes.note(peer_id, engine_class)
        return peer_id, token

    def peer(self, peer_id: str, token: str) -> str:
        """Who a request is from (a peer that left is not marked as seen by its requests still in flight)."""
        return self.admission.peer(peer_id, token, touch=peer_id not in self.departed)

    def leave(self, peer_id: str, token: str) -> int:
        """The peer is going (its page closes, or its volunteer gave one core fewer): its live leases are released at
        once, so their units go to the next peer that asks instead of waiting out the lease, and it no longer counts
        as connected. Returns how many leases were released."""
        peer_id = self.peer(peer_id, token)
        self.departed[peer_id] = time.monotonic()
        released = self.store.release_leases_on_leaving(peer_id)
        self.store.depart(peer_id)
        self.store.count("peers_left")
        if released:
            self.store.count("leases_released_on_leave", released)
        self.notices.work_changed()
        self.notices.changed()
        return released

    # -- handing out work ---------------------------------------------------------------------------------------
    def next_work(self, peer_id: str) -> WorkAnswer:
        """The peer's next job, or why it waits, or that the session is done. A round that became ready without a
        result to trigger its merge (a restart after the last result, a passed deadline) is merged first."""
        if not self.merging and self.round_ready():
            self.merge_soon()
        session = self.session
        if session.done:
            return Done(session.stopped or "the session is complete")
        self.disk.refuse_while_full()
        unjudgeable = self.verification.refusal_for_peer(peer_id)
        if unjudgeable is not None:  # (its results are refused: it would train for nothing)
            raise unjudgeable
        if self.paused:
            return Wait(self.options.retry_seconds, "paused")
        if self.merging and not self.mode.hands_out_while_merging:
            return Wait(self.options.retry_seconds, "merging the round")
        return self.mode.next_job(peer_id)

    async def work(self, peer_id: str, token: str, *, hold: float = 0.0, back: bool = False) -> WorkAnswer:
        """``next_work``, held up to ``hold`` seconds (at most ``max_hold_seconds``) while the answer is a wait:
        answered the moment work exists (``work_changed``) or a unit in flight crosses the backup threshold. A
        held answer is a ``Wait`` of 0 s (ask again at once). Each pass authenticates again: a held peer stays
        connected, and one banned meanwhile is told so. A peer that left comes back only with ``back`` (the
        ask after its own leave): an ask it sent before leaving can reach the relay after the leave (a closing page's
        last request racing its keepalive leave) and must not lease it a unit nor count it connected again."""
        asked = time.monotonic()
        deadline = asked + min(hold, self.max_hold_seconds)
        if peer_id in self.departed:
            if not back:  # (an ask sent before the peer left that arrives after: its page is gone; no lease)
                self.peer(peer_id, token)
                return Wait(self.options.retry_seconds, "this peer left the session: ask with back=1 to come back")
            self.admission.peer(peer_id, token)  # a peer that left asks again, saying so: it is back
            del self.departed[peer_id]
        woken = False  # (this pass answers a wake: ``Notices.woken_done`` once it has its answer)
        while True:
            try:
                if self.departed.get(peer_id, -math.inf) >= asked:  # (a held ask of a peer that left meanwhile)
                    return Wait(0.0, "this peer left the session")
                job = self.next_work(self.peer(peer_id, token))
            finally:
                if woken:
                    self.notices.woken_done()
                    woken = False
            remaining = deadline - time.monotonic()
            if not isinstance(job, Wait) or remaining <= 0:
                return replace(job, wait=0.0) if hold and isinstance(job, Wait) else job
            backup_in = self.copies.backups.next_backup_in()  # (held until work may exist, or a backup is due)
            woken = await self.notices.hold_for_work(remaining if backup_in is None else min(remaining, backup_in))

    def holds_unit(self, peer_id: str, unit_index: int) -> bool:
        """Whether ``peer_id`` holds a live lease on ``unit_index`` (it may fetch the unit's data)."""
        return self.mode.holds_unit(peer_id, unit_index)

    def weights_message(self) -> bytes:
        return self.jobs.weights_message()

    def weights_of(self, version: int) -> bytes | None:
        """The weights a job names (``weights_round``): the current ones, or in async mode a kept recent version."""
        return self.weights_message() if version == self.session.round else self.mode.weights_of_version(version)

    # -- results ------------------------------------------------------------------------------------------------
    def uploading(self, peer_id: str, round_index: int, slot: int) -> contextlib.AbstractAsyncContextManager[None]:
        """A turn to read a result's body and submit it (``server.relay.uploads``), before others where a merge waits
        for it (``RoundMode.awaited``)."""
        return self.uploads.turn(self.store.peer_address(peer_id), first=self.mode.awaited(round_index, slot))

    async def submit(self, peer_id: str, round_index: int, slot: int, body: bytes) -> StoredResult:
        """``submit_result`` with the result read in a worker thread first (``RoundMode.reader``; see
        ``server.relay.uploads``). A replica of a synchronous session hands it to the holder (``sharing.py``)."""
        if self.sharing.forwards:
            return await self.sharing.forward(peer_id, round_index, slot, body)
        return await self.uploads.read(self.mode.reader(peer_id, round_index, slot, body),
                                       lambda early: self.submit_result(peer_id, round_index, slot, body, early))

    def submit_result(self, peer_id: str, round_index: int, slot: int, body: bytes,
                      early: EarlyRead | None = None) -> StoredResult:
        """Check and store a result (``mode.accept``), count it and say so; a merge follows when the round is
        ready. A refusal is counted by code (``refused.<code>``), noted in the participants table and raised."""
        try:
            stored = self.mode.accept(peer_id, round_index, slot, body, early)
        except Refusal as refusal:
            self.people.note_refusal(peer_id)
            self.count_refusal(refusal)
            raise
        self.store.count("results_accepted")
        self.notices.changed()
        self.merge_soon()
        return stored

    def count_refusal(self, refusal: Refusal) -> None:
        """Count a refusal once, by code (the HTTP handler counts those the relay's API has not)."""
        if not refusal.counted:
            refusal.counted = True
            self.store.count(f"refused.{refusal.code}")
            self.notices.changed()

    # -- verdicts of replays ----------------------------------------------------------------------------------
    def apply_verdicts(self) -> None:
        """Apply the finished replays: count each, ban the peer of a failed one; settle disputes. Runs on the event
        loop as each replay ends, and before a merge. A full disk holds the rest back for the next call."""
        verdicts = self.verification.take_verdicts()
        for index, verdict in enumerate(verdicts):
            try:
                if not self.verification.record(verdict):
                    self.bans.ban(verdict.peer_id, self.verification.failure(verdict))
            except Exception as error:
                if not is_storage_error(error):
                    raise
                self.verification.hold_back(verdicts[index:])
                self.disk.note_problem(error)
                return
        self.mode.settle(verdicts)

    # -- merging --------------------------------------------------------------------------------------------------
    def round_ready(self) -> bool:
        """Whether the round (or, in async mode, the buffer) may merge now."""
        return self.mode.ready()

    def merge_soon(self) -> None:
        """On an event loop: ``maybe_complete_round`` in the background. Without one (the virtual-clock simulator)
        nothing: that driver calls ``merge_ready`` itself."""
        self.merges.soon()

    def merge_ready(self) -> list[dict[str, Any]]:
        """Merge, inline, every round that is ready, and return their history entries."""
        return self.merges.merge_ready()

    async def maybe_complete_round(self) -> None:
        """Merge the round if it is ready (on the loop; the merge in a thread), after its undos and replays."""
        await self.merges.maybe_complete_round()

    def serve_restored(self, session: Session) -> None:
        """The session as of its last checkpoint, after a merge failed on the disk (the pause is in the store)."""
        self.start_session(session, self.store)
