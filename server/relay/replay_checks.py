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
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from runtime import wire
from runtime.planner import Assignment
from server.browser_assets import engines
from server.relay.context import RelayContext
from server.relay.direction import DIRECTION, direction_of
from server.relay.engine_classes import EngineClasses
from server.relay.jobs import Jobs
from server.relay.refusal import Refusal
from server.relay.remote_replays import StoreReplays
from server.relay.store import StoredResult
from server.relay.undo_rules import UndoRules
from server.relay.verify import COVERAGE, ROUTINE, Replay, ReplayQueue, Verdict, Verifier, matches

LOG = logging.getLogger("peertrain.relay")


def call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback`` on ``loop`` from another thread; nothing when the loop has closed (the relay stopped)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass


def passed(verdict: Verdict) -> str:
    """A passed replay as its result's audit row says it."""
    return f"replay passed ({verdict.reason}, " + (
        "identical bits)" if verdict.exact else f"deviation {verdict.relative_deviation:.2g})")


class ReplayChecks:
    """``queue`` is None where verification is off (``serve --no-verify``, a local task). ``undo_rules``:
    whether a ban can undo what its peer moved (then, with ``--replay-wait suspects``, a routine replay may be judged
    after its round's merge). ``on_verdict`` runs on the event loop after each replay ends (the relay applies the
    verdicts)."""

    def __init__(self, context: RelayContext, jobs: Jobs, *, undo_rules: UndoRules,
                 on_verdict: Callable[[], None]) -> None:
        self.context, self.jobs, self.undo_rules, self.on_verdict = context, jobs, undo_rules, on_verdict
        self.queue: ReplayQueue | None = None
        self.engine: str = "native"  # the replays' engine
        self.engine_note: str | None = None  # why --replay-engine auto fell back to native (or the task's module)
        self._unapplied: list[Verdict] = []  # verdicts a full disk kept from being applied
        self.wait_seconds = 0.0  # how long the last merge waited for its round's replays (its added time)
        # Peers whose result was refused for its engine (peer id -> the engine it named): they are not handed
        # more work to waste, and a round that only they could train says what it needs (``waiting``).
        self.unjudgeable_peers: dict[str, str] = {}
        # What each peer trains on: copies of units the host cannot replay go to peers of their class only
        self.classes = EngineClasses(context)
        self.start()

    @property
    def active(self) -> bool:
        return self.queue is not None

    def start(self) -> None:
        """For the session being served: a verifier of its own task on the engine ``--replay-engine`` names, or
        none."""
        self.close()
        self.unjudgeable_peers = {}
        self.classes.reset()
        options, session, package = self.context.options, self.context.session, self.context.package
        replayable = options.verify and session.task.kind != "local"  # (a peer's own data: no replay)
        self.engine, self.engine_note = engines.resolve(options.replay_engine,
                                                        engines.host_only_task(package.manifest))
        task_info = {**package.task_description(), "task_source": package.manifest.get("task_source")}
        remote = StoreReplays(self.context.store, task_info, self.engine) if replayable and \
            options.remote_replays else None
        verifier = Verifier(task_info, rtol=options.verify_rtol, atol=options.verify_atol, engine=self.engine,
                            workers=options.replay_workers or engines.default_workers(),
                            replays=remote) if replayable else None
        self.queue = ReplayQueue(verifier, fraction=options.verify_fraction, seed=session.config.seed,
                                 every=options.verify_every, direction=options.verify_direction,
                                 trust=options.verify_trust,
                                 identity=lambda peer_id: self.context.store.identity(peer_id)) if verifier else None

    def refusal(self, engine: str) -> Refusal | None:
        """A result this session's replays cannot judge: trained on another engine than the replays', on a task
        whose units part ways across engines (a self-declared engine must not be a way around the checks)."""
        if self.queue is None or self.context.session.task.replay_across_engines:
            return None
        if engine == self.queue.verifier.engine_name:
            return None
        return Refusal(422, "engine_not_replayable", f"this session checks {self.context.session.task.name} results "
                       f"by replaying them bit for bit on {self.queue.verifier.engine_name}, and its units part ways "
                       f"across engines; a result trained on {engine or 'an unnamed engine'} cannot be checked (a "
                       "page trains such a session on the CPU" + (
                           "; nor is another connected peer of its engine class here to train copies of its units"
                           if self.context.options.redundancy > 0 else
                           "; a session with --redundancy checks such results by copies among peers of one engine "
                           "class") + ")")

    def judges(self, engine: str) -> bool:
        """Whether the host's replays can judge a result trained on ``engine`` (or nothing is replayed)."""
        return self.refusal(engine) is None

    def refuse_engine(self, peer_id: str, refusal: Refusal, engine: str) -> Refusal:
        """``refusal`` (``engine_not_replayable``) for ``peer_id``, remembered: its next ask for work is refused."""
        self.unjudgeable_peers[peer_id] = engine
        return refusal

    def refusal_for_peer(self, peer_id: str) -> Refusal | None:
        """The refusal of a peer whose engine this session cannot judge, asking for more work (None: any other)."""
        engine = self.unjudgeable_peers.get(peer_id)
        return None if engine is None else self.refusal(engine)

    def needed(self, active: list[str]) -> str | None:
        """In words, when every connected peer trains on an engine this session cannot judge: what it needs."""
        if self.queue is None or not active or any(peer not in self.unjudgeable_peers for peer in active):
            return None
        engines_named = sorted({self.unjudgeable_peers[peer] or "an unnamed engine" for peer in active})
        return (f"a peer on {self.queue.verifier.engine_name} (a browser page trains on it): the connected peers "
                f"train on {', '.join(engines_named)}, whose results this session cannot check bit for bit"
                + ("" if self.context.options.redundancy > 0 else
                   " (with --redundancy, peers of one engine class check each other by copies)"))

    def dry_run(self) -> str:
        """A task from a file, at set-up: one unit of the open round trained on the replays' engine twice and natively,
        in words (whether its units replay exactly, and whether a native replay could judge them)."""
        if self.queue is None or self.engine != "pyodide":
            return "no dry run of the replays: " + ("host replays are off" if self.queue is None else
                                                    f"replays run natively ({self.engine_note or 'asked for'})")
        session, store, task_info = self.context.session, self.context.store, self.queue.verifier.task_info
        assignment = session.assignments()[0]
        job, weights = self.jobs.job(assignment, store.clock()), self.jobs.weights_message()
        unit = self.context.package.chunk_bytes(assignment.unit_index) if session.task.kind == "data" else None
        pyodide = engines.PyodideEngine()
        try:
            first, second = (pyodide.train(task_info, job, weights, unit) for _ in range(2))
        except engines.EngineError as error:
            return f"dry run: one unit of {session.task.name} could not be trained on the browser's engine: {error}"
        finally:
            pyodide.close()
        native = engines.NativeEngine().train(task_info, job, weights, unit)
        _, base = wire.decode(weights)
        codec = session.config.result_codec
        (_, a), (_, b), (_, c) = (wire.result_weights(m, base, codec=codec) for m in (first, second, native))
        if a.tobytes() != b.tobytes():
            return (f"dry run: one unit of {session.task.name} trained twice on the browser's engine gave different "
                    "weights; replays will ban honest peers (does it read the clock or an unseeded generator?)")
        _, relative = matches(c, a, base, rtol=0, atol=0)
        native_word = ("natively it is identical too" if relative == 0 else
                       f"natively it differs by {relative:.3g} of its update, "
                       + ("within" if relative <= self.context.options.verify_rtol else "beyond")
                       + f" the native replays' tolerance {self.context.options.verify_rtol:g}")
        return (f"dry run: one unit of {session.task.name} replays exactly on the browser's engine (Pyodide under "
                f"Node), so results are compared bit for bit; {native_word}")

    def describe(self) -> dict[str, Any]:
        """The page's and the status's word on how results are replayed."""
        if self.queue is None:
            return {"engine": None}
        verifier = self.queue.verifier
        return {"engine": verifier.engine_name, "exact": verifier.engine == "pyodide", "workers": verifier.workers,
                **({"fallback": self.engine_note} if self.engine_note else {})}

    def close(self) -> None:
        if self.queue is not None:
            self.queue.verifier.close()

    # -- what gets replayed ------------------------------------------------------------------------------
    def forget_record(self, peer_id: str) -> None:
        """A peer's ban was lifted: the trust its passed replays earned starts afresh (``server.relay.coverage``)."""
        if self.queue is not None:
            self.queue.coverage.forget(peer_id)

    def judges_direction(self) -> bool:
        """Whether results are judged by their direction (``verify`` wants the sum of the round's others)."""
        return self.queue is not None and self.queue.direction is not None

    def verify(self, stored: StoredResult, vector: np.ndarray, *, outlier: bool = False,
               others: np.ndarray | None = None) -> str | None:
        """Queue a replay of this result when the rules say so (``ReplayQueue.reason``); ``others``: the sum of the
        updates of the round's results accepted before it (``RoundBook.sum_of_updates``), for its direction. A
        result of an engine the host cannot replay (accepted where a peer of its class can train a copy) is not
        replayed: the reason a replay would have had is returned, and a copy checks it instead (BOINC's homogeneous
        redundancy; adaptive replication picks which, as it picks replays)."""
        if self.queue is None:
            return None
        direction = None
        if not outlier and self.queue.direction is not None:
            session = self.context.session
            direction = direction_of(vector.astype(np.float64) - session.weights, session.merge.last_delta, others)
        reason = self.queue.reason(stored.peer_id, stored.round, stored.slot, outlier=outlier, direction=direction)
        if not self.judges(stored.engine):
            self._drop_prepared(stored.round, stored.slot)
            return None if outlier else reason
        if reason is None:
            return None
        if reason in (COVERAGE,) or reason.startswith(DIRECTION):
            self.context.store.count("replays_for_coverage" if reason == COVERAGE else "replays_for_direction")
        deferred = reason in ROUTINE and self.context.options.replay_wait == "suspects" and self.undo_rules.active
        self.queue_replay(stored.slot, {stored.peer_id: vector}, reason,
                          ("outlier" if outlier else "result", stored.slot, stored.peer_id),
                          engines={stored.peer_id: stored.engine}, deferred=deferred)
        return None

    def _drop_prepared(self, round_index: int, slot: int) -> None:
        """A replay started at hand-out for a slot whose result came from an engine the host cannot replay."""
        assert self.queue is not None
        entry = self.queue.prepared.pop((round_index, slot), None)
        if entry is not None and not entry[1][0]:
            entry[0].cancel()

    def verify_round(self, kept: Sequence[tuple[StoredResult, np.ndarray]], total: np.ndarray | None,
                     results: int) -> None:
        """The round's last result is in: each result not replayed yet whose weights are ``kept`` is judged again
        by its direction, now against all the round's others (``total``: the sum of the updates of its ``results``
        results). One that came early had few or none to compare with; a round that sums its results as they come
        keeps the weights of its first ``EARLY`` (``server.relay.book``): each later one was judged on arrival
        against at least that many."""
        if self.queue is None or self.queue.direction is None or results < 2 or total is None:
            return
        weights = self.context.session.weights
        for stored, vector in kept:
            if not self.judges(stored.engine):
                continue  # (its copy checks it)
            update = vector.astype(np.float64) - weights
            direction = direction_of(update, None, total - update)
            if self.queue.suspect(direction) and self.queue.mark_replayed(stored.round, stored.slot, stored.peer_id):
                self.context.store.count("replays_for_direction")
                self.queue_replay(stored.slot, {stored.peer_id: vector}, f"{direction.describe()} (round complete)",
                                  ("result", stored.slot, stored.peer_id), engines={stored.peer_id: stored.engine})

    def queue_replay(self, slot: int, results: dict[str, np.ndarray], reason: str, key: Any,
                     engines: dict[str, str] | None = None, *, deferred: bool = False) -> None:
        """Replay ``slot`` of the open round once and judge ``results`` (peer -> weights, each trained on the engine
        ``engines`` names) against it; ``deferred``: the round's merge does not wait for the verdict."""
        assert self.queue is not None
        round_index = self.context.session.round
        prepared = self.queue.prepared_replay(round_index, slot)
        if prepared is None:
            prepared = self._start_replay(slot), True
        self._judge(prepared, round_index, slot, results, reason, key, engines, deferred=deferred)

    def replay_arrival(self, assignment: Assignment, weights: np.ndarray, results: dict[str, np.ndarray],
                       reason: str, key: Any, engines: dict[str, str]) -> None:
        """Async mode: replay ``assignment`` (a schedule entry as its "slot", the version it started from as its
        "round") from that version's ``weights`` and judge ``results`` against it. The merges wait for it through
        the buffer (``server.relay.arrival_checks``), not its round."""
        assert self.queue is not None
        replay = self._start(assignment, self.jobs.message(weights, assignment.round))
        self._judge((replay, True), assignment.round, assignment.slot, results, reason, key, engines, deferred=True)

    def _judge(self, prepared: tuple[Future[Replay], bool], round_index: int, slot: int,
               results: dict[str, np.ndarray], reason: str, key: Any, engines: dict[str, str] | None, *,
               deferred: bool) -> None:
        assert self.queue is not None
        future = self.queue.verifier.judge(prepared[0], round_index=round_index, slot=slot, results=results,
                                           reason=reason, count_seconds=prepared[1], engines=engines)
        self.queue.queue(round_index, key, future, deferred=deferred)
        self.context.store.count("replays_queued")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the app (a test): verdicts apply at the merge
            return
        future.add_done_callback(lambda _: call_soon(loop, self.on_verdict))

    def on_loop(self) -> None:
        """The app's event loop runs (its start-up): the verdicts of replays queued before it (a restart's, of
        results a check held) apply as each ends, as if queued on it."""
        if self.queue is not None:
            loop = asyncio.get_running_loop()
            for future in list(self.queue.pending.values()):
                future.add_done_callback(lambda _: call_soon(loop, self.on_verdict))

    def _start_replay(self, slot: int) -> Future[Replay]:
        assignment = {a.slot: a for a in self.context.session.assignments()}[slot]
        return self._start(assignment, self.jobs.weights_message())

    def _start(self, assignment: Assignment, weights_message: bytes) -> Future[Replay]:
        assert self.queue is not None
        session, store = self.context.session, self.context.store
        unit = self.context.package.chunk_bytes(assignment.unit_index) if session.task.kind == "data" else None
        return self.queue.verifier.replay(job=self.jobs.job(assignment, store.clock()),
                                          weights_message=weights_message, unit_message=unit)

    def prepare(self, peer_id: str, slot: int) -> None:
        """At hand-out: start replaying a slot whose result will be checked, so the check costs only a
        comparison when the result comes (a replay needs the job, not the result)."""
        round_index = self.context.session.round
        said = self.classes.engine(peer_id)  # (where it said: a copy from its class checks what the host cannot replay)
        if said and not self.judges(said):
            return
        if self.queue is not None and self.queue.will_check(peer_id, round_index, slot) and \
                (round_index, slot) not in self.queue.prepared:
            self.queue.prepare(round_index, slot, self._start_replay(slot))
            self.context.store.count("replays_started_at_hand_out")

    # -- verdicts ----------------------------------------------------------------------------------------
    async def wait(self, round_index: int, *, final: bool = False) -> None:
        """Until every replay queued for ``round_index`` that its merge waits for has its verdict (``final``: every
        pending replay: the session ends with this merge, and nothing is undone after it)."""
        if self.queue is not None and (final or not self.context.async_mode):  # (async: ``ArrivalChecks.held``)
            await self.queue.wait(round_index, final=final)

    def pending(self, round_index: int) -> int:
        """Replays of ``round_index`` still running that the round merges after."""
        if self.queue is None:
            return 0
        pending = self.queue.pending
        return sum(1 for key in self.queue.blocking(round_index) if key in pending and not pending[key].done())

    def replaying(self, count: int) -> str:
        """What the round waits for while ``count`` of its results are replayed, in words for the waiting line: the
        host, or verification workers (with how many replays wait in the store for one, so a host who started none
        sees why the round waits)."""
        results = f"{count} result{'s' if count > 1 else ''}"
        if self.context.options.remote_replays:
            queued = self.context.store.replay_jobs_waiting()
            return (f"{results} wait for their replays by verification workers ({queued} queued in the store; each "
                    "`peertrain verify-worker --store URL` takes one at a time)")
        return f"the host is replaying {results}"

    def take_verdicts(self) -> list[Verdict]:
        """The verdicts not applied yet: those a full disk held back, then the replays finished since."""
        verdicts = self._unapplied + (self.queue.finished() if self.queue is not None else [])
        self._unapplied = []
        return verdicts

    def hold_back(self, verdicts: list[Verdict]) -> None:
        """A full disk stopped applying these: they come first at the next ``take_verdicts``."""
        self._unapplied = verdicts

    def record(self, verdict: Verdict) -> bool:
        """Count and log a verdict; a passed one goes into the result's audit row. Returns whether it passed (a
        replay the host failed to run passes nobody and fails nobody: counted and logged)."""
        store = self.context.store
        if verdict.error:
            store.count("replays_failed_on_host")
            LOG.warning("replay of round %d slot %d (%s) for peer %s not run: %s", verdict.round, verdict.slot,
                        verdict.reason, verdict.peer_id, verdict.error)
            return True
        store.count("results_verified" if verdict.ok else "verification_failed")
        LOG.log(logging.INFO if verdict.ok else logging.WARNING, "replay of round %d slot %d (%s): peer %s %s, "
                "deviation %.3g of the update", verdict.round, verdict.slot, verdict.reason, verdict.peer_id,
                "passed" if verdict.ok else "FAILED", verdict.relative_deviation)
        if verdict.ok:  # (an arrival's: ``ArrivalChecks.settle``, which knows it is one)
            store.set_verification(verdict.round, verdict.slot, verdict.peer_id, passed(verdict))
        return verdict.ok

    def failure(self, verdict: Verdict) -> str:
        """Why a failed verdict bans its peer, in words for the admin listing."""
        tolerance = "it must be identical" if verdict.exact else f"tolerance {self.context.options.verify_rtol:g}"
        return (f"a result of round {verdict.round + 1} differs from the host's replay by "
                f"{verdict.relative_deviation:.3g} of its update ({tolerance})")

    def costs(self, round_index: int) -> dict[str, Any] | None:
        """The history's ``verification`` entry of a round (None: nothing was replayed)."""
        costs = self.queue.costs(round_index) if self.queue is not None else None
        return {**costs, "waited_seconds": self.wait_seconds} if costs else None

    def forget_before(self, round_index: int) -> None:
        if self.queue is not None:
            self.queue.forget_before(round_index)
