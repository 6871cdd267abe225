"""When the relay merges (``MergeSchedule``, a part of the relay): on the event loop in the background after each
result and at a round's deadline, or inline for a driver without a loop (the virtual-clock simulator).

Before a merge, the undos bans asked for run (``server.relay.undo``) and the round's replays it waits for end
(``server.relay.replay_checks``); their verdicts may ban a peer, whose slots are then out again and the merge waits.
The merge itself is the round mode's (``RoundMode.merge_blocking``), in a worker thread while the relay says it is
merging; a full disk stops it where its last checkpoint stands (``server.relay.storage``). After it: the merged
rounds' bookkeeping is forgotten, the next round opens, and the page's samples are generated from the new weights
(in the background, outside the merge's lock).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from server.relay.book import RoundBook
from server.relay.context import Part, RelayContext
from server.relay.pacing import RoundPacing
from server.relay.replay_checks import ReplayChecks
from server.relay.round_mode import RoundMode
from server.relay.status import Samples
from server.relay.storage import StorageGuard, is_storage_error
from server.relay.undo import BanUndo

HANDOUT_SECONDS = 2.0  # longest the samples wait after a merge for the woken held requests to have their answers


class MergeSchedule(Part):
    """``mode``: the relay's round mode at the time of the call (a new session brings its own). ``apply_verdicts``:
    the relay's, run before a merge once its replays are in. ``lock``: the merge's lock, which undos and a session's
    replacement (``server.relay.admin``) take too."""

    def __init__(self, context: RelayContext, *, mode: Callable[[], RoundMode], book: RoundBook,
                 replays: ReplayChecks, undo: BanUndo, pacing: RoundPacing, disk: StorageGuard,
                 apply_verdicts: Callable[[], None], samples: Samples) -> None:
        self.context, self.mode, self.book, self.replays, self.undo = context, mode, book, replays, undo
        self.pacing, self.disk, self.apply_verdicts, self.samples = pacing, disk, apply_verdicts, samples
        self.lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to its tasks
        self._samples_task: asyncio.Task[None] | None = None  # (``samples_soon``)
        self._samples_wanted = False
        self._closing = asyncio.Event()  # set by ``hold_for_close``: a merge still waiting for replays gives up

    def watch_deadline(self) -> None:
        """After the round's first hand-out: try to merge when its deadline comes (results also try)."""
        deadline = self.pacing.deadline
        if deadline is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (the simulator, a test): the driver's next event checks the deadline
            return
        loop.call_later(deadline + 0.05, self.soon)

    def soon(self) -> None:
        """On an event loop: ``maybe_complete_round`` in the background, holding a reference until it is done.
        Without one (the virtual-clock simulator) nothing: that driver calls ``merge_ready`` itself."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self.maybe_complete_round())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _merge_blocking(self) -> dict[str, Any]:
        """The merge (a worker thread, or inline): checkpointed by ``Session``, then older messages pruned, disk
        measured."""
        entry = self.mode().merge_blocking()
        self.disk.prune_results()
        self.disk.measure()
        return entry

    def _merged(self) -> None:
        """After a merge (or a failed one): forget the merged rounds' bookkeeping, open the next round."""
        self.book.forget_before(self.session.round)
        self.replays.forget_before(self.session.round)
        self.context.merging = False
        self.context.notices.work_changed(available=self.mode().units_open())

    def merge_ready(self) -> list[dict[str, Any]]:
        """Merge, inline, every round that is ready (no replays are awaited: a driver without an event loop runs
        without host replays), and return their history entries."""
        entries = []
        self.undo_inline()
        while not self.context.merging and not self.session.done and not self.undo.pending() and self.mode().ready():
            self.context.merging = True
            self.context.notices.changed()
            try:
                entries.append(self._merge_blocking())
            finally:
                self._merged()
            self.undo_inline()
        return entries

    def undo_inline(self) -> None:
        """Run the undos bans asked for (``server.relay.undo``), inline: at start-up and without an event loop."""
        for _ in range(len(self.store.undos()) if self.undo.pending() else 0):
            if not self.undo.begin():
                return
            try:
                self.undo.redo_blocking()
            finally:
                self.undo.end()

    async def undo_bans(self) -> None:
        """Run the undos bans asked for, each in a worker thread while the relay says it is merging (under the
        merge's lock: a ban during a merge is undone after it). A full disk stops one where its last checkpoint
        stands; it goes on when space returns."""
        for _ in range(len(self.store.undos()) if self.undo.pending() and not self.disk.problem else 0):
            if not self.undo.begin():
                return
            try:
                await asyncio.to_thread(self.undo.redo_blocking)
            except Exception as error:
                if not is_storage_error(error):
                    raise
                self.disk.merge_failed(error)
                return
            finally:
                self.undo.end()

    async def hold_for_close(self, seconds: float) -> bool:
        """Before the relay closes (the app's shutdown): take the merge's lock, waiting up to ``seconds`` for a merge
        in flight to write its checkpoint, and keep it, so that no merge starts on a closing store. (A merge's worker
        thread outlives the event loop's tasks: closed under it, it wrote to a closed store and metrics log.) Whether
        it was taken."""
        self._closing.set()
        try:
            await asyncio.wait_for(self.lock.acquire(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    async def maybe_complete_round(self) -> None:
        """Merge if the round (async: the buffer) is ready, under the merge's lock. Each result asks for this; a
        merge that leaves the buffer ready again (async: results came faster than merges) asks once more."""
        async with self.lock:
            merged = await self._complete_round()
        if merged and not self.session.done and self.mode().ready():
            self.soon()

    async def _complete_round(self) -> bool:
        """``maybe_complete_round``'s work, under the lock: whether it merged."""
        await self.undo_bans()
        session = self.session
        if self.undo.pending() or not self.mode().ready():  # (an undo held back by a full disk comes first)
            return False
        waited = time.perf_counter()
        if not await self._replays_before_close(session.round, final=session.round + 1 >= session.num_rounds):
            return False
        self.apply_verdicts()
        self.replays.wait_seconds = time.perf_counter() - waited
        await self.undo_bans()  # (a replay banned a peer whose earlier results were merged)
        if self.undo.pending() or not self.mode().ready():  # a replay banned a peer: its slots are out again
            return False
        self.context.merging = True
        self.context.notices.changed()
        try:
            await asyncio.to_thread(self._merge_blocking)
        except Exception as error:  # (a checkpoint library may word a full disk in its own exception)
            if not is_storage_error(error):
                raise
            self.disk.merge_failed(error)  # back to the last checkpoint; tried again when space returns
            return False
        finally:
            self._merged()
        self.samples_if_validated()
        return True

    async def _replays_before_close(self, round_index: int, *, final: bool) -> bool:
        """Wait for the replays the merge of ``round_index`` needs; False where the relay began to close first (a
        merge waiting for verification workers that nobody started held the shutdown for ``CLOSE_MERGE_SECONDS``):
        nothing is merged, and the next start waits for them again."""
        if self._closing.is_set():
            return False
        replays = asyncio.ensure_future(self.replays.wait(round_index, final=final))
        closing = asyncio.ensure_future(self._closing.wait())
        await asyncio.wait((replays, closing), return_when=asyncio.FIRST_COMPLETED)
        for waiter in (replays, closing):
            waiter.cancel()
        if not replays.done() or replays.cancelled():
            return False
        replays.result()  # (a replay's failure surfaces as it did before)
        return True

    def samples_if_validated(self) -> None:
        """The page's samples of the weights merged last, where that merge was validated (async mode validates every
        few merges: samples of weights without metrics would show the page a model its charts lack)."""
        history = self.session.history
        if history and (not self.context.async_mode or history[-1]["metrics"]):
            self.samples_soon()

    def samples_soon(self) -> None:
        """The page's samples of the weights just merged, in the background and outside the merge's lock: a round
        of fast units must not wait for text generation to merge. One generation at a time; merges meanwhile
        leave one more to run, for the newest weights."""
        self._samples_wanted = True
        if self._samples_task is None or self._samples_task.done():
            self._samples_task = asyncio.get_running_loop().create_task(self._show_samples())

    async def _show_samples(self) -> None:
        while self._samples_wanted:
            self._samples_wanted = False
            session = self.session
            rounds, weights = session.round, session.weights
            # the held requests the round's opening woke take their units before the samples' thread competes with
            # this loop for the GIL
            await self.context.notices.woken_answered(HANDOUT_SECONDS)
            latest = await asyncio.to_thread(Samples.generate, session, weights)
            if self.session is session:  # (not a session replaced meanwhile)
                self.samples.show(latest, rounds)
                self.context.notices.changed()
