"""The relay's side of verification by replay (``server.relay.verify``) and bans: a mixin of ``Relay``.

Which results are replayed and how is ``ReplayQueue``'s business; this part hands them over with what a replay
needs (the job as the peer got it, the round's weights, the unit's data), applies the verdicts on the event
loop as they come in, and bans: a peer whose result fails its replay (or that claims more examples than its
unit holds) loses its token, its address may not join again, and its results of the open round are dropped
so their slots are handed out again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from server.relay.sqlite_store import Store, StoredResult
from server.relay.storage import is_storage_error
from server.relay.verify import DISPUTE, Replay, ReplayQueue, Verifier

LOG = logging.getLogger("peertrain.relay")

if TYPE_CHECKING:
    from server.session.package import Package
    from server.session.session import Session


def call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback`` on ``loop`` from another thread; nothing when the loop has closed (the relay stopped)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass


class ReplayChecks:
    """Needs from the relay: ``session``, ``package``, ``store``, ``options``, ``replays``, ``_decoded``,
    ``weights_message``, ``_assignment_json``, ``changed`` and ``work_changed``."""

    session: Session
    package: Package
    store: Store
    options: Any
    replays: ReplayQueue | None
    _decoded: dict[tuple[int, int], Any]
    _unapplied: list[Any] = []  # verdicts a full disk kept from being applied (an instance list once set)
    note_storage_problem: Callable[[BaseException], None]  # (server.relay.storage.StorageGuard)

    def weights_message(self) -> bytes:
        raise NotImplementedError

    def _assignment_json(self, assignment: Any, deadline: float) -> dict[str, Any]:
        raise NotImplementedError

    def changed(self) -> None:
        raise NotImplementedError

    def work_changed(self) -> None:
        raise NotImplementedError

    # -- verification by replay and bans (server.relay.verify) ----------------------------------------
    def _start_replays(self) -> None:
        if self.replays is not None:
            self.replays.verifier.close()
        replayable = self.options.verify and self.session.task.kind != "local"  # (a peer's own data: no replay)
        verifier = Verifier(self.package.task_description(), rtol=self.options.verify_rtol,
                            atol=self.options.verify_atol) if replayable else None
        self.replays = ReplayQueue(verifier, fraction=self.options.verify_fraction,
                                   seed=self.session.config.seed) if verifier else None

    def verify(self, stored: StoredResult, vector: np.ndarray, *, outlier: bool = False) -> None:
        """Queue a replay of this result when the rules say so (``ReplayQueue.reason``)."""
        reason = self.replays.reason(stored.peer_id, stored.round, stored.slot, outlier=outlier) \
            if self.replays is not None else None
        if self.replays is None or reason is None:
            return
        self._queue_replay(stored.slot, {stored.peer_id: vector}, reason, ("outlier" if outlier else "result",
                                                                           stored.slot, stored.peer_id))

    def _queue_replay(self, slot: int, results: dict[str, np.ndarray], reason: str, key: Any) -> None:
        """Replay ``slot`` of the open round once and judge ``results`` (peer -> weights) against it."""
        assert self.replays is not None
        round_index = self.session.round
        prepared = self.replays.prepared_replay(round_index, slot)
        if prepared is None:
            prepared = self._start_replay(slot), True
        job = {"round": round_index, "slot": slot}
        future = self.replays.verifier.judge(prepared[0], job=job, results=results, reason=reason,
                                             count_seconds=prepared[1])
        self.replays.queue(round_index, key, future)
        self.store.count("replays_queued")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the app (a test): verdicts apply at the merge
            return
        future.add_done_callback(lambda _: call_soon(loop, self.apply_verdicts))

    def _start_replay(self, slot: int) -> Future[Replay]:
        assert self.replays is not None
        assignment = {a.slot: a for a in self.session.assignments()}[slot]
        unit = self.package.chunk_bytes(assignment.unit_index) if self.session.task.kind == "data" else None
        return self.replays.verifier.replay(job=self._assignment_json(assignment, self.store.clock()),
                                            weights_message=self.weights_message(), unit_message=unit)

    def prepare_replay(self, peer_id: str, slot: int) -> None:
        """At hand-out: start replaying a slot whose result will be checked, so the check costs only a
        comparison when the result comes (a replay needs the job, not the result)."""
        if self.replays is not None and self.replays.will_check(peer_id, self.session.round, slot) and \
                (self.session.round, slot) not in self.replays.prepared:
            self.replays.prepare(self.session.round, slot, self._start_replay(slot))
            self.store.count("replays_started_at_hand_out")

    async def wait_for_replays(self, round_index: int) -> None:
        """Until every replay queued for ``round_index`` has its verdict (a round merges only after them)."""
        if self.replays is not None:
            await self.replays.wait(round_index)
        self.apply_verdicts()

    def apply_verdicts(self) -> None:
        """Count the finished replays; a failed one bans its peer. Runs on the event loop as each one ends."""
        verdicts = self._unapplied + (self.replays.finished() if self.replays is not None else [])
        self._unapplied = []
        for index, verdict in enumerate(verdicts):
            try:
                self._apply_verdict(verdict)
            except Exception as error:  # a full disk: the rest are applied at the next call
                if not is_storage_error(error):
                    raise
                self._unapplied = verdicts[index:]
                self.note_storage_problem(error)
                return
        self.settle_disputes([v for v in verdicts if v.reason == DISPUTE])

    def _apply_verdict(self, verdict: Any) -> None:
        self.store.count("results_verified" if verdict.ok else "verification_failed")
        LOG.log(logging.INFO if verdict.ok else logging.WARNING, "replay of round %d slot %d (%s): peer %s %s, "
                "deviation %.3g of the update", verdict.round, verdict.slot, verdict.reason, verdict.peer_id,
                "passed" if verdict.ok else "FAILED", verdict.relative_deviation)
        if verdict.ok:
            self.store.set_verification(verdict.round, verdict.slot, verdict.peer_id, f"replay passed "
                                        f"({verdict.reason}, deviation {verdict.relative_deviation:.2g})")
        else:
            self.ban(verdict.peer_id, f"a result of round {verdict.round + 1} differs from the host's replay "
                     f"by {verdict.relative_deviation:.3g} of its update (tolerance {self.options.verify_rtol:g})")

    def settle_disputes(self, verdicts: list[Any]) -> None:
        raise NotImplementedError

    def promote_settled_copy(self, round_index: int, slot: int) -> None:
        raise NotImplementedError

    def ban(self, peer_id: str, reason: str) -> None:
        """Ban for the session: token revoked, address refused at join, the open round's results dropped and
        their slots handed out again. Stored in SQLite (survives a restart); ``unban`` lifts it."""
        if self.store.ban_reason(peer_id) is None:
            self.store.ban(peer_id, reason)
            self.store.count("peers_banned")
        round_index = self.session.round
        for slot in self.store.remove_results_of(peer_id, round_index):
            self._decoded.pop((round_index, slot), None)
            self.store.count("results_dropped_by_ban")
            self.promote_settled_copy(round_index, slot)
        self.work_changed()

    def unban(self, peer_id: str) -> bool:
        lifted = self.store.unban(peer_id)
        self.changed()
        return lifted

