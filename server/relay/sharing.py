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
buffer, then merges from then on. Only asynchronous sessions are served together: a synchronous round's replays,
copies and backups are decided in one process (``serve`` waits for the hold instead)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from server.relay.context import Part, RelayContext
from server.relay.merge_schedule import MergeSchedule
from server.relay.refusal import Refusal
from server.relay.round_mode import RoundMode
from server.session.following import checkpoint_ahead, follow

WATCH_SECONDS = 0.2  # how often a relay looks at what the others did (a newer checkpoint; a buffer they filled)
HOLD_SECONDS = 0.5  # how often a replica asks for the session's hold (its holder may have died)
CATCH_UP_SECONDS = 5.0  # the longest a replica waits for the checkpoint of weights a peer names (being written)
CATCH_UP_POLL_SECONDS = 0.02


class SharedServing(Part):
    """``mode``: the relay's round mode now; ``merges``: its merge schedule. ``take_hold`` (set by ``serve``): asks
    for the session's hold without waiting (True: this relay holds it now), and ``on_held`` runs once it does."""

    def __init__(self, context: RelayContext, *, mode: Callable[[], RoundMode], merges: MergeSchedule) -> None:
        self.context, self.mode, self.merges = context, mode, merges
        self.take_hold: Callable[[], bool] | None = None
        self.on_held: Callable[[], None] = lambda: None
        self.followed = 0  # checkpoints taken on from the holder

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
        """Runs for the relay's life (the app's lifespan) on a shared store."""
        asked = 0.0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            if self.context.replica:
                await self.follow()
                if self.take_hold is not None and loop.time() - asked >= HOLD_SECONDS:
                    asked = loop.time()
                    if await asyncio.to_thread(self.take_hold):
                        await self.take_over()
            elif self.context.async_mode and not self.context.merging and self.mode().ready():
                self.merges.soon()  # (a synchronous round's results all reach this relay: each asks for its merge)

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
        print(f"this relay holds the session now (after round {self.session.round}): it merges from here on",
              flush=True)
        self.on_held()
        self.merges.soon()
        self.context.notices.changed()
