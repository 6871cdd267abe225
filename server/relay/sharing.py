"""Relays serving one session together (``SharedServing``): several ``peertrain serve`` processes over one
PostgreSQL store and one session folder, behind one proxy. The relay that holds the session (``SessionHold``) is the
only one that merges, checkpoints and answers the host's changes (pause, stop, unban, a new session); every other
one is a *replica*: it hands out units, takes and checks results, serves weights, the page and its event stream.

What makes that correct is kept in the database, decided there in one statement: a lease (one live lease per unit,
with the weights version it went out with), an arrival (one per unit), the buffer the merge takes its K oldest
from. What a relay keeps of the rows it read (``SQLStore``'s views) lasts ``SHARED_VIEW_SECONDS`` on a shared
store. So a peer may ask one relay for work and send its result to another: that relay reads the lease afresh.

Each relay looks every ``WATCH_SECONDS``: the holder of an asynchronous session whether the buffer is ready
(results that reached the others add to it without waking it), a replica whether the holder wrote a newer
checkpoint, which it takes on (the new weights, and the versions merged in between, that results started from
them are read against). A replica that
takes the hold (its holder died: its database connection went, and the lock with it) takes the session over as a
restarted relay would: the newest checkpoint, the arrivals a merge marked that no checkpoint holds back in the
buffer, then merges from then on.

A synchronous round's sums, copies, replays and refusals live in the holder's process, so a replica of a synchronous
session decides none of them: it hands out the round's units (each lease granted in the database) and takes their
results, and hands each result to the holder through the store (``ForwardStore``); the holder judges it exactly as
if its peer had sent it there (``FORWARD_POLL_SECONDS`` later at most) and the replica answers its peer with the
holder's verdict. The holder keeps in the store which slots want a second copy (its ``CopyChoice`` decides), and a
replica hands those copies out too; backups only the holder hands out (a unit's time in flight is its measure)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from server.relay.context import Part, RelayContext
from server.relay.copies import UnitCopies
from server.relay.merge_schedule import MergeSchedule
from server.relay.refusal import Refusal
from server.relay.round_mode import RoundMode
from server.relay.store import StoredResult
from server.session.following import checkpoint_ahead, follow

WATCH_SECONDS = 0.2  # how often a relay looks at what the others did (a newer checkpoint; a buffer they filled)
HOLD_SECONDS = 0.5  # how often a replica asks for the session's hold (its holder may have died)
CATCH_UP_SECONDS = 5.0  # the longest a replica waits for the checkpoint of weights a peer names (being written)
CATCH_UP_POLL_SECONDS = 0.02
FORWARD_POLL_SECONDS = 0.02  # how often the holder looks for results handed over, and a replica for the verdict
FORWARD_SECONDS = 60.0  # the longest a replica waits for the holder's verdict on a result (then: 503)
FORWARD_BATCH = 32  # results handed over the holder reads at one look

type Submit = Callable[[str, int, int, bytes], Awaitable[StoredResult]]


class SharedServing(Part):
    """``mode``: the relay's round mode now; ``merges``: its merge schedule. ``take_hold`` (set by ``serve``): asks
    for the session's hold without waiting (True: this relay holds it now), and ``on_held`` runs once it does."""

    def __init__(self, context: RelayContext, *, mode: Callable[[], RoundMode], merges: MergeSchedule,
                 submit: Submit, copies: UnitCopies) -> None:
        self.context, self.mode, self.merges = context, mode, merges
        self.submit, self.copies = submit, copies  # (the relay's own result path; a round's second copies)
        self.published: tuple[object, int, frozenset[int]] | None = None  # (the copies wanted, as last kept: the
        # store they were kept in, the round, the slots)
        self.take_hold: Callable[[], bool] | None = None
        self.on_held: Callable[[], None] = lambda: None
        self.followed = 0  # checkpoints taken on from the holder
        self._verdicts: dict[int, asyncio.Future[dict[str, Any]]] = {}  # results handed over -> their verdicts
        self._collector: asyncio.Task[None] | None = None  # (one look for every verdict awaited: ``collect``)
        self._wanted_seen: tuple[int, frozenset[int]] = (-1, frozenset())  # (a replica's: ``wake_for_copies``)

    @property
    def watching(self) -> bool:
        """Whether other relays may serve the session with this one (its store is shared)."""
        return self.store.shared

    def refuse_on_replica(self, what: str) -> None:
        """A change only the holding relay makes (``409 replica``), asked of a replica."""
        if self.context.replica:
            raise Refusal(409, "replica", f"this relay serves the session beside the one that holds it, which alone "
                          f"can {what}: send it there (or stop that relay: this one takes the session over)")

    async def watch(self) -> None:
        """Runs for the relay's life (the app's lifespan) on a shared store: looks at what the others did, and judges
        the results replicas handed over while this relay holds a synchronous session."""
        await asyncio.gather(self.look(), self.judge())

    async def look(self) -> None:
        asked = 0.0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            if self.context.replica:
                await self.follow()
                await self.wake_for_copies()
                if self.take_hold is not None and loop.time() - asked >= HOLD_SECONDS:
                    asked = loop.time()
                    if await asyncio.to_thread(self.take_hold):
                        await self.take_over()
            elif not self.context.merging and self.mode().ready():
                self.merges.soon()  # (a buffer the others filled; a round a replica opened, past its deadline)

    async def follow(self) -> bool:
        """Take on the holder's newest checkpoint, if it wrote one since; whether it did."""
        session = self.session
        ahead = await asyncio.to_thread(checkpoint_ahead, session)
        if ahead is None or session is not self.session or not self.context.replica:
            return False
        follow(session, ahead)
        self.mode().follow(ahead.between)
        self.followed += 1
        self.context.notices.work_changed()
        self.context.notices.changed()
        self.merges.samples_if_validated()  # (its page shows the text of the weights it follows, as the holder's)
        return True

    async def wake_for_copies(self) -> None:
        """On a replica whose peers hold their asks: wake them when the holder wants copies it did not at the last
        look (each ask reads them afresh, but an ask held for work waited out its hold while a copy waited)."""
        context = self.context
        if context.async_mode or context.options.redundancy <= 0 or not context.notices.holding:
            return
        round_index = self.session.round
        wanted = frozenset(await asyncio.to_thread(self.copies.needing, round_index))
        seen_round, seen = self._wanted_seen
        self._wanted_seen = round_index, wanted
        if wanted - (seen if seen_round == round_index else frozenset()):
            context.notices.work_changed()

    async def catch_up(self, version: int | None = None) -> bool:
        """On a replica asked about weights ``version`` past its own (a job the holder handed out as it merged; None:
        weights it does not know by their digest): take on the holder's newer checkpoints first, waiting up to
        ``CATCH_UP_SECONDS`` for the one it is writing. Whether it took one on. Nothing on the holder."""
        if not self.context.replica or (version is not None and version <= self.session.round):
            return False
        loop = asyncio.get_running_loop()
        deadline, caught = loop.time() + CATCH_UP_SECONDS, False
        while True:
            caught = await self.follow() or caught
            if version is None or version <= self.session.round or loop.time() >= deadline:
                return caught
            await asyncio.sleep(CATCH_UP_POLL_SECONDS)

    async def take_over(self) -> None:
        """This replica holds the session now: from the newest checkpoint, with the arrivals a merge had marked that
        it lacks back in the buffer, it merges from now on."""
        await self.follow()
        self.context.replica = False
        self.session.round_log.begin(self.session, new=False)  # (its metrics sinks write from here on)
        returned = self.store.unmerge_from(self.session.round)
        if returned:
            self.store.count("arrivals_returned_to_buffer_on_takeover", returned)
        self.store.count("takeovers")
        self.mode().follow({})  # (its merge's sum opens on the weights of now)
        if not self.session.done:
            self.mode().restarted()  # (what a restarted relay settles before it serves)
        print(f"this relay holds the session now (after round {self.session.round}): it merges from here on",
              flush=True)
        self.on_held()
        self.merges.soon()
        self.context.notices.changed()

    # -- a synchronous session's results, taken by a replica and judged by the holder ---------------------------------
    @property
    def forwards(self) -> bool:
        """Whether this relay hands the results it takes to the holder (a replica of a synchronous session)."""
        return self.context.replica and not self.context.async_mode

    async def forward(self, peer_id: str, round_index: int, slot: int, body: bytes) -> StoredResult:
        """On a replica of a synchronous session: hand a result to the holder through the store and answer as it
        judged it (its refusal raised as the holder refused it: counted there). A holder that judges nothing for
        ``FORWARD_SECONDS`` (it died, and no relay holds the session yet) has the result taken back: ``503
        holder_unavailable``, try again."""
        store, loop = self.store, asyncio.get_running_loop()
        forward_id = store.forward_result(round_index, slot, peer_id, body)
        store.count("results_forwarded")
        waiter = self._verdicts[forward_id] = loop.create_future()
        if self._collector is None or self._collector.done():
            self._collector = loop.create_task(self.collect())
        try:
            verdict = await asyncio.wait_for(asyncio.shield(waiter), FORWARD_SECONDS)
        except TimeoutError:  # (nothing awaited between here and the answer: the collector cannot take it meanwhile)
            if not waiter.done() and store.withdraw_forwarded(forward_id):
                raise Refusal(503, "holder_unavailable", f"the relay holding the session judged no result for "
                              f"{FORWARD_SECONDS:.0f} s; send it again in a moment (another relay takes the session "
                              "over when its holder stopped)", headers={"Retry-After": "5"}) from None
            verdict = waiter.result() if waiter.done() else store.take_verdicts([forward_id])[forward_id]
        finally:
            self._verdicts.pop(forward_id, None)
        if "error" in verdict:
            refusal = Refusal(int(verdict["status"]), str(verdict["error"]), str(verdict["message"]),
                              headers=verdict.get("headers"))
            refusal.counted = True
            raise refusal
        self.context.notices.changed()
        return StoredResult(round_index, slot, int(verdict["unit_index"]), peer_id, int(verdict["num_examples"]),
                            {}, b"")

    async def collect(self) -> None:
        """While results handed over wait for their verdicts: every ``FORWARD_POLL_SECONDS``, one read of the store
        for all of them (not one per upload)."""
        said = ""
        while self._verdicts:
            await asyncio.sleep(FORWARD_POLL_SECONDS)
            waiting = [forward_id for forward_id, waiter in self._verdicts.items() if not waiter.done()]
            try:
                found = self.store.take_verdicts(waiting) if waiting else {}
            except Exception as error:  # (the store away for a moment: the next look; the waits have their bound)
                if repr(error) != said:
                    print(f"peertrain serve: could not read the holder's verdicts: {error!r}", flush=True)
                said = repr(error)
                continue
            for forward_id, verdict in found.items():
                waiter = self._verdicts.get(forward_id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(verdict)

    async def judge(self) -> None:
        """While this relay holds a synchronous session: judge the results replicas handed over, in the order they
        came, as if their peers had sent them here."""
        said = ""
        while True:
            await asyncio.sleep(FORWARD_POLL_SECONDS)
            if self.context.replica or self.context.async_mode:
                continue
            try:
                await self.judge_forwarded()
                self.publish_copies()
            except Exception as error:  # (the store away for a moment, a new session's opening: the next look)
                if repr(error) != said:
                    print(f"peertrain serve: could not read the results replicas handed over: {error!r}", flush=True)
                said = repr(error)

    def publish_copies(self) -> None:
        """Keep in the store which slots of the round want a second copy, where it changed, for replicas to hand out
        (not those only a peer of an engine class may train: which peer is of which class is this relay's)."""
        if self.session.done:
            return
        round_index = self.session.round
        slots = frozenset(slot for slot in self.copies.needing(round_index)
                          if (round_index, slot) not in self.copies.classes.slots)
        if (self.store, round_index, slots) != self.published:
            self.store.want_copies(round_index, slots)
            self.published = self.store, round_index, slots

    async def judge_forwarded(self) -> int:
        """Judge what replicas handed over (up to ``FORWARD_BATCH``); how many."""
        handed = self.store.forwarded(FORWARD_BATCH)
        for result in handed:
            verdict: dict[str, object]
            try:
                banned = self.store.ban_reason(result.peer_id)  # (banned since its replica let the upload in)
                if banned is not None:
                    raise Refusal(403, "banned", f"this peer is banned from the session: {banned}")
                stored = await self.submit(result.peer_id, result.round, result.slot, result.message)
                self.publish_copies()  # (before the replica hears: the copies this result wants, or no longer does)
                verdict = {"unit_index": stored.unit_index, "num_examples": stored.num_examples}
            except Refusal as refusal:
                verdict = {"status": refusal.status, "headers": refusal.headers, **refusal.to_json()}
            except Exception as error:  # (the holder could not judge it: the replica's peer sends it again)
                print(f"peertrain serve: a result handed over by a replica could not be judged: {error!r}",
                      flush=True)
                verdict = {"status": 503, "error": "holder_unavailable", "headers": {"Retry-After": "5"},
                           "message": f"the relay holding the session could not judge the result: {error}"}
            self.store.settle_forwarded(result.id, verdict)
        return len(handed)
