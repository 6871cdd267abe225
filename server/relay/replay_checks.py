"""The relay's side of verification by replay (``server.relay.verify``): ``ReplayChecks``, a part of the relay.

Which results are replayed and how is ``ReplayQueue``'s business; this part hands them over with what a replay
needs (the job as the peer got it, the round's weights, the unit's data), starts replays at hand-out for results
that will be checked, and gives the finished verdicts back to the relay, which applies them on the event loop as
they come in (a failed one bans its peer: ``server.relay.bans``; a dispute's settles the copies:
``server.relay.copies``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from server.relay.context import RelayContext
from server.relay.jobs import Jobs
from server.relay.sqlite_store import StoredResult
from server.relay.verify import Replay, ReplayQueue, Verdict, Verifier

LOG = logging.getLogger("peertrain.relay")


def call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback`` on ``loop`` from another thread; nothing when the loop has closed (the relay stopped)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass


class ReplayChecks:
    """``queue`` is None where verification is off (``serve --no-verify``, a local task, async mode). ``on_verdict``
    runs on the event loop after each replay ends (the relay applies the verdicts)."""

    def __init__(self, context: RelayContext, jobs: Jobs, *, on_verdict: Callable[[], None]) -> None:
        self.context, self.jobs, self.on_verdict = context, jobs, on_verdict
        self.queue: ReplayQueue | None = None
        self._unapplied: list[Verdict] = []  # verdicts a full disk kept from being applied
        self.wait_seconds = 0.0  # how long the last merge waited for its round's replays (its added time)
        self.start()

    @property
    def active(self) -> bool:
        return self.queue is not None

    def start(self) -> None:
        """For the session being served: a verifier of its own task, or none."""
        self.close()
        options, session = self.context.options, self.context.session
        replayable = options.verify and session.task.kind != "local"  # (a peer's own data: no replay)
        verifier = Verifier(self.context.package.task_description(), rtol=options.verify_rtol,
                            atol=options.verify_atol) if replayable else None
        self.queue = ReplayQueue(verifier, fraction=options.verify_fraction,
                                 seed=session.config.seed) if verifier else None

    def close(self) -> None:
        if self.queue is not None:
            self.queue.verifier.close()

    # -- what gets replayed ------------------------------------------------------------------------------
    def verify(self, stored: StoredResult, vector: np.ndarray, *, outlier: bool = False) -> None:
        """Queue a replay of this result when the rules say so (``ReplayQueue.reason``)."""
        reason = self.queue.reason(stored.peer_id, stored.round, stored.slot, outlier=outlier) \
            if self.queue is not None else None
        if reason is None:
            return
        self.queue_replay(stored.slot, {stored.peer_id: vector}, reason,
                          ("outlier" if outlier else "result", stored.slot, stored.peer_id))

    def queue_replay(self, slot: int, results: dict[str, np.ndarray], reason: str, key: Any) -> None:
        """Replay ``slot`` of the open round once and judge ``results`` (peer -> weights) against it."""
        assert self.queue is not None
        round_index = self.context.session.round
        prepared = self.queue.prepared_replay(round_index, slot)
        if prepared is None:
            prepared = self._start_replay(slot), True
        job = {"round": round_index, "slot": slot}
        future = self.queue.verifier.judge(prepared[0], job=job, results=results, reason=reason,
                                           count_seconds=prepared[1])
        self.queue.queue(round_index, key, future)
        self.context.store.count("replays_queued")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the app (a test): verdicts apply at the merge
            return
        future.add_done_callback(lambda _: call_soon(loop, self.on_verdict))

    def _start_replay(self, slot: int) -> Future[Replay]:
        assert self.queue is not None
        session, store = self.context.session, self.context.store
        assignment = {a.slot: a for a in session.assignments()}[slot]
        unit = self.context.package.chunk_bytes(assignment.unit_index) if session.task.kind == "data" else None
        return self.queue.verifier.replay(job=self.jobs.job(assignment, store.clock()),
                                          weights_message=self.jobs.weights_message(), unit_message=unit)

    def prepare(self, peer_id: str, slot: int) -> None:
        """At hand-out: start replaying a slot whose result will be checked, so the check costs only a
        comparison when the result comes (a replay needs the job, not the result)."""
        round_index = self.context.session.round
        if self.queue is not None and self.queue.will_check(peer_id, round_index, slot) and \
                (round_index, slot) not in self.queue.prepared:
            self.queue.prepare(round_index, slot, self._start_replay(slot))
            self.context.store.count("replays_started_at_hand_out")

    # -- verdicts ----------------------------------------------------------------------------------------
    async def wait(self, round_index: int) -> None:
        """Until every replay queued for ``round_index`` has its verdict (a round merges only after them)."""
        if self.queue is not None:
            await self.queue.wait(round_index)

    def pending(self, round_index: int) -> int:
        """Replays of ``round_index`` still running (the round merges after them)."""
        if self.queue is None:
            return 0
        return sum(1 for (r, _), future in list(self.queue.pending.items()) if r == round_index and not future.done())

    def take_verdicts(self) -> list[Verdict]:
        """The verdicts not applied yet: those a full disk held back, then the replays finished since."""
        verdicts = self._unapplied + (self.queue.finished() if self.queue is not None else [])
        self._unapplied = []
        return verdicts

    def hold_back(self, verdicts: list[Verdict]) -> None:
        """A full disk stopped applying these: they come first at the next ``take_verdicts``."""
        self._unapplied = verdicts

    def record(self, verdict: Verdict) -> bool:
        """Count and log a verdict; a passed one goes into the result's audit row. Returns whether it passed."""
        store = self.context.store
        store.count("results_verified" if verdict.ok else "verification_failed")
        LOG.log(logging.INFO if verdict.ok else logging.WARNING, "replay of round %d slot %d (%s): peer %s %s, "
                "deviation %.3g of the update", verdict.round, verdict.slot, verdict.reason, verdict.peer_id,
                "passed" if verdict.ok else "FAILED", verdict.relative_deviation)
        if verdict.ok:
            store.set_verification(verdict.round, verdict.slot, verdict.peer_id, f"replay passed "
                                   f"({verdict.reason}, deviation {verdict.relative_deviation:.2g})")
        return verdict.ok

    def failure(self, verdict: Verdict) -> str:
        """Why a failed verdict bans its peer, in words for the admin listing."""
        return (f"a result of round {verdict.round + 1} differs from the host's replay by "
                f"{verdict.relative_deviation:.3g} of its update (tolerance {self.context.options.verify_rtol:g})")

    def costs(self, round_index: int) -> dict[str, Any] | None:
        """The history's ``verification`` entry of a round (None: nothing was replayed)."""
        costs = self.queue.costs(round_index) if self.queue is not None else None
        return {**costs, "waited_seconds": self.wait_seconds} if costs else None

    def forget_before(self, round_index: int) -> None:
        if self.queue is not None:
            self.queue.forget_before(round_index)
