"""Checking results by replay: the host trains a unit again and compares.

A unit is a deterministic function of (global weights, the unit's data or episode seed, the task's settings),
so an honest result can be reproduced. The host replays on the browser's own engine where it can
(``server.browser_assets.engines``: Pyodide under Node, the page's npm package, lock file and wheels, calling the
module the page's worker calls): a result a browser trained on the CPU must then be the replay **bit for bit**.
Any other pair (a result trained on WebGPU or natively, or replays on the native fallback, where the summation
orders of the matmul kernels differ) is accepted when, on the update,

    |result - replay| <= rtol * |replay - global| + atol

A cheat cannot stay inside either bound and still move the model its way: noise, a flipped, scaled or zeroed
update (a free-rider) all differ from the replay by a large fraction of the update itself. Which results are
replayed: every peer's first result, a seeded random share (``fraction``), one of every N accepted results of a
peer at the latest (``server.relay.coverage``), every update pointing away from its round's others
(``server.relay.direction``) and every result a check or the aggregator flags as an outlier. Replays run on a pool
of worker threads, each with its own engine (the merge's validation uses the session's task), so verification
overlaps the round. A round merges after the replays of its suspects (outliers, updates pointing away); a routine
replay (a peer's first result, the coverage bound, the share) is judged when it ends, after its round's merge if
need be but before the next round's, where a ban can undo what its peer moved (``serve --replay-wait suspects``, the
default; ``server.relay.undo``), and before its own merge where it cannot (differential privacy, async mode,
``--undo-rounds 0``, ``--replay-wait all``): a round then waits for its replays queued behind each other on a small
machine. A replay needs only the job, so the
relay starts the replay of a unit it will check when it hands the unit out (the peer's first, its coverage bound or
the sampled share: all known then); the check is a comparison.
Host replay does not depend on who the peers are, so many identities do not help a cheat. A replay the host
itself fails to run (its engine crashed or hung) is no verdict on anyone: it is counted and logged.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from runtime import wire
from runtime.codec import Codec
from runtime.protocol import Job
from server.browser_assets.engines import NATIVE, PYODIDE_CPU, Engine, EngineError, PyodideEngine, make_engine
from server.relay.coverage import Coverage
from server.relay.direction import Direction

# Calibrated from browser results against native replays (BENCHMARKS.md, "Replay tolerance"): the largest
# relative deviation seen was far below this; the margin absorbs other browsers' summation orders.
DEFAULT_VERIFY_RTOL = 1e-2
DEFAULT_VERIFY_ATOL = 1e-6
DEFAULT_VERIFY_FRACTION = 0.1
DISPUTE = "two copies of the unit disagree"  # the reason of a replay that decides between two copies
FIRST, COVERAGE, SAMPLED = "first result of the peer", "coverage", "sampled"  # (and "outlier", "direction: ...")
ROUTINE = (FIRST, COVERAGE, SAMPLED)  # replays of results nothing made suspect (``serve --replay-wait suspects``)
REPLAY_WAITS = ("suspects", "all")  # which replays a merge waits for


@dataclass(frozen=True)
class Verdict:
    """The outcome of one replay: ``ok``, the deviation relative to the replayed update, and the seconds."""

    round: int
    slot: int
    peer_id: str
    ok: bool
    relative_deviation: float
    seconds: float
    reason: str  # why this result was replayed (first, sampled, outlier)
    exact: bool = False  # compared bit for bit (the result and the replay from the browser's engine on the CPU)
    error: str = ""  # the host could not replay the unit (its engine failed): no verdict on the peer


def deviation(result: np.ndarray, replay: np.ndarray, global_weights: np.ndarray) -> tuple[float, float]:
    """(|result - replay|, |replay - global|) in float64."""
    replay64 = replay.astype(np.float64)
    return (float(np.linalg.norm(result.astype(np.float64) - replay64)),
            float(np.linalg.norm(replay64 - global_weights.astype(np.float64))))


def matches(result: np.ndarray, replay: np.ndarray, global_weights: np.ndarray, *, rtol: float,
            atol: float) -> tuple[bool, float]:
    """Whether ``result`` is the replay within tolerance, and the deviation relative to the replayed update."""
    off, scale = deviation(result, replay, global_weights)
    return off <= rtol * scale + atol, off / scale if scale > 0 else (0.0 if off == 0 else float("inf"))


@functools.lru_cache(maxsize=1 << 16)
def sampled(seed: int, round_index: int, slot: int, fraction: float, purpose: str = "verify") -> bool:
    """A seeded coin per (round, slot): the same session draws the same share, and a peer cannot tell which.
    ``purpose`` keeps the coins of replays and of second copies (redundancy) apart. (Kept: every request for work
    asks it of each slot of the round that may want a copy.)"""
    if fraction >= 1:
        return True
    digest = hashlib.sha256(f"{purpose}:{seed}:{round_index}:{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


@dataclass(frozen=True)
class Replay:
    """A unit trained on the host: its weights, the global weights it started from, the seconds it took and the
    engine that trained it (``server.browser_assets.engines``)."""

    weights: np.ndarray
    global_weights: np.ndarray
    seconds: float
    engine: str = ""


def compared_exactly(replay_engine: str, result_engine: str) -> bool:
    """Whether a result is compared with its replay bit for bit: both from the browser's engine on the CPU (the same
    code on the same float kernels gives the same bytes); any other pair within the tolerance."""
    return replay_engine == result_engine == PYODIDE_CPU


class Replays(Protocol):
    """Who runs the replays: ``LocalReplays`` (threads of this process) or ``server.relay.remote_replays``
    (verification workers anywhere, through the store)."""

    workers: int

    def replay(self, job: Job, weights_message: bytes, unit_message: bytes | None) -> Future[Replay]: ...

    def close(self) -> None: ...


def replayed(job: Job, weights_message: bytes, message: bytes, seconds: float, engine: str) -> Replay:
    """A replay's result message as the weights it trained, beside the global weights it started from."""
    _, global_weights = wire.decode(weights_message)
    _, weights = wire.result_weights(message, global_weights, codec=Codec.from_json(job.codec) if job.codec
                                     else Codec())
    return Replay(weights, global_weights, seconds, engine)


class LocalReplays:
    """Replays units on a pool of ``workers`` threads of this process, each with an engine of its own
    (``server.browser_assets.engines``: Pyodide under Node, the browser's engine, or native numpy)."""

    def __init__(self, task_info: dict[str, Any], engine: str, workers: int) -> None:
        self.task_info, self.engine, self.workers = task_info, engine, workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="replay")
        self._local = threading.local()  # each replay thread's engine
        self._engines: list[Engine] = []
        self._engines_lock = threading.Lock()
        if engine == "pyodide":  # boot the workers now (seconds each), not when the first unit must be replayed
            for _ in range(workers):
                self._pool.submit(self._engine)

    def replay(self, job: Job, weights_message: bytes, unit_message: bytes | None) -> Future[Replay]:
        return self._pool.submit(self._train, job, weights_message, unit_message)

    def _train(self, job: Job, weights_message: bytes, unit_message: bytes | None) -> Replay:
        started = time.perf_counter()
        engine = self._engine()
        message = engine.train(self.task_info, job, weights_message, unit_message)
        return replayed(job, weights_message, message, time.perf_counter() - started, engine.name)

    def _engine(self) -> Engine:
        """This replay thread's engine (started on first use: a Pyodide worker boots)."""
        engine: Engine | None = getattr(self._local, "engine", None)
        if engine is None:
            engine = self._local.engine = make_engine(self.engine)
            with self._engines_lock:
                self._engines.append(engine)
        if isinstance(engine, PyodideEngine):
            try:
                engine.boot_report  # noqa: B018 (boots the worker)
            except EngineError:
                pass  # (the replay that needs it says why)
        return engine

    def close(self) -> None:
        """Stop the pool; the engines' workers exit (a Pyodide worker at the end of its input)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._engines_lock:
            engines, self._engines = self._engines, []
        for engine in engines:
            threading.Thread(target=engine.close, daemon=True, name="replay-close").start()


class Verifier:
    """Judges results against replays of their units, run by ``replays`` (``LocalReplays``: ``workers`` threads of
    this process, each with an engine of its own; or verification workers through the store,
    ``server.relay.remote_replays``).

    A replay needs only the job, never the result, so the relay starts the replay of a unit it will check
    when it hands the unit out (``replay``), and the check (``judge``) is a comparison when the result comes."""

    def __init__(self, task_info: dict[str, Any], *, rtol: float, atol: float, engine: str = "native",
                 workers: int = 1, replays: Replays | None = None) -> None:
        self.task_info = task_info
        self.rtol, self.atol = rtol, atol
        self.engine = engine  # "pyodide" or "native"
        self.engine_name = PYODIDE_CPU if engine == "pyodide" else NATIVE  # what its replays' results would say
        self.replays = replays if replays is not None else LocalReplays(task_info, engine, workers)
        self.workers = self.replays.workers

    def replay(self, *, job: Job, weights_message: bytes, unit_message: bytes | None) -> Future[Replay]:
        return self.replays.replay(job, weights_message, unit_message)

    def judge(self, replay: Future[Replay], *, round_index: int, slot: int, results: dict[str, np.ndarray],
              reason: str, count_seconds: bool = True, engines: dict[str, str] | None = None) -> Future[list[Verdict]]:
        """Each peer's result of (``round_index``, ``slot``) against ``replay`` once it is done (two when a unit's
        copies disagree); ``count_seconds``: this judgement carries the replay's cost (the first judgement of a
        replay); ``engines``: the engine each result names (bit for bit where ``compared_exactly``, else within the
        tolerance)."""
        verdicts: Future[list[Verdict]] = Future()

        def compare(done: Future[Replay]) -> None:
            try:
                try:
                    replayed = done.result()
                except EngineError as error:  # the host's trouble: no verdict against anyone
                    verdicts.set_result([Verdict(round_index, slot, peer_id, True, math.nan, 0.0,
                                                 reason, error=str(error)) for peer_id in results])
                    return
                seconds = replayed.seconds if count_seconds else 0.0
                found = []
                for peer_id, result in results.items():
                    exact = compared_exactly(replayed.engine, (engines or {}).get(peer_id, ""))
                    ok, relative = matches(result, replayed.weights, replayed.global_weights,
                                           rtol=0.0 if exact else self.rtol, atol=0.0 if exact else self.atol)
                    if exact:
                        ok = result.dtype == replayed.weights.dtype and result.tobytes() == replayed.weights.tobytes()
                    found.append(Verdict(round_index, slot, peer_id, ok, relative, seconds, reason,
                                         exact=exact))
                    seconds = 0.0  # one replay, counted once
                verdicts.set_result(found)
            except BaseException as error:  # (cancelled when the relay closes)
                verdicts.set_exception(error)

        replay.add_done_callback(compare)
        return verdicts

    def submit(self, *, job: Job, weights_message: bytes, unit_message: bytes | None,
               results: dict[str, np.ndarray], reason: str) -> Future[list[Verdict]]:
        """Replay ``job`` now and judge ``results`` against it."""
        return self.judge(self.replay(job=job, weights_message=weights_message, unit_message=unit_message),
                          round_index=job.round, slot=job.slot, results=results, reason=reason)

    def close(self) -> None:
        """Stop the replays (``LocalReplays``: the pool; the engines' workers exit)."""
        self.replays.close()


class ReplayQueue:
    """The replays of the open rounds: which results to replay, the pending ones, the peers already checked."""

    def __init__(self, verifier: Verifier, *, fraction: float, seed: int, every: int = 0,
                 direction: float | None = None, trust: int = 0,
                 identity: Callable[[str], str] = lambda peer_id: peer_id) -> None:
        self.verifier, self.fraction, self.seed = verifier, fraction, seed
        self.identity = identity  # who a peer is for its record: its volunteer (``server.relay.volunteers``) or itself
        # at most ``every`` accepted results of a peer between two checks (up to ``trust`` for a record of passes)
        self.coverage = Coverage(every, seed, trust, identity=identity)
        self.direction = direction  # replay updates pointing away (``server.relay.direction``); None: never
        self.replayed: set[tuple[int, int, str]] = set()  # (round, slot, peer) results queued for a replay
        self.pending: dict[tuple[int, Any], Future[list[Verdict]]] = {}  # (round, which result(s))
        self.deferred: set[tuple[int, Any]] = set()  # pending replays their round's merge does not wait for
        # (round, slot) -> a replay started when the slot was handed out, and whether a judgement counted it
        self.prepared: dict[tuple[int, int], tuple[Future[Replay], list[bool]]] = {}
        self.checked_peers: set[str] = set()  # peers with a result that passed a replay
        self.first_queued: set[str] = set()  # volunteers (or peers) whose first result is (or was) queued
        self.seconds: dict[int, float] = {}  # replay seconds per round (the history's costs)
        self.counts: dict[int, int] = {}  # results replayed per round

    def reason(self, peer_id: str, round_index: int, slot: int, *, outlier: bool = False,
               direction: Direction | None = None) -> str | None:
        """Why this result should be replayed, or None: a refused outlier; else (an accepted result, which moves
        the peer's coverage window) a suspect by direction, the peer's first, the coverage bound, the sampled share."""
        if outlier:
            return "outlier"
        first = self.identity(peer_id) not in self.first_queued
        self.first_queued.add(self.identity(peer_id))
        why = (direction.describe() if self.suspect(direction) and direction is not None else
               FIRST if first else COVERAGE if self.coverage.due(peer_id) else
               SAMPLED if self._sampled(round_index, slot, peer_id) else None)
        self.coverage.note(peer_id, checked=why is not None)
        if why is not None:
            self.replayed.add((round_index, slot, peer_id))
        return why

    def mark_replayed(self, round_index: int, slot: int, peer_id: str) -> bool:
        """Note a result queued for a replay outside ``reason`` (a suspect once its round is complete); False when
        it was queued already."""
        key = (round_index, slot, peer_id)
        if key in self.replayed:
            return False
        self.replayed.add(key)
        return True

    def suspect(self, direction: Direction | None) -> bool:
        return self.direction is not None and direction is not None and direction.suspect(self.direction)

    def will_check(self, peer_id: str, round_index: int, slot: int) -> bool:
        """At hand-out: whether this slot's result will be replayed (the peer's first, its coverage bound, or the
        sampled share; a suspect by direction is known only when the result comes)."""
        return self.identity(peer_id) not in self.first_queued or self.coverage.due(peer_id) or \
            self._sampled(round_index, slot, peer_id)

    def _sampled(self, round_index: int, slot: int, peer_id: str) -> bool:
        return self.fraction > 0 and sampled(self.seed, round_index, slot, self.coverage.share(self.fraction, peer_id))

    def prepare(self, round_index: int, slot: int, replay: Future[Replay]) -> None:
        self.prepared.setdefault((round_index, slot), (replay, [False]))

    def prepared_replay(self, round_index: int, slot: int) -> tuple[Future[Replay], bool] | None:
        """The replay started for this slot at hand-out, and whether this is its first judgement (which counts
        its seconds); None when none was started."""
        entry = self.prepared.get((round_index, slot))
        if entry is None:
            return None
        first = not entry[1][0]
        entry[1][0] = True
        return entry[0], first

    def forget_before(self, round_index: int) -> None:
        """Drop the replays prepared for earlier rounds; one that no judgement has taken is cancelled (one a judgement
        took runs on: a deferred verdict waits for it)."""
        for key in [key for key in self.prepared if key[0] < round_index]:
            replay, judged = self.prepared.pop(key)
            if not judged[0]:
                replay.cancel()
        self.replayed = {key for key in self.replayed if key[0] >= round_index}

    def queue(self, round_index: int, key: Any, future: Future[list[Verdict]], *, deferred: bool = False) -> None:
        self.pending[(round_index, key)] = future
        if deferred:
            self.deferred.add((round_index, key))

    def blocking(self, round_index: int) -> list[tuple[int, Any]]:
        """The replays the merge of ``round_index`` waits for, finished or not: its own that are not deferred, and
        every one of an earlier round (a deferred replay is judged before the next round merges, so a result that
        fails it was merged once at most before its ban undoes it)."""
        return [key for key in self.pending if key[0] < round_index or
                (key[0] == round_index and key not in self.deferred)]

    async def wait(self, round_index: int, *, final: bool = False) -> None:
        """Until the replays the merge of ``round_index`` waits for are done (``blocking``; their verdicts stay for
        ``finished``); a deferred one is judged when it ends, by the next merge at the latest. ``final`` (the merge
        that ends the session, after which nothing is undone): every pending replay."""
        for key in list(self.pending) if final else self.blocking(round_index):
            future = self.pending.get(key)  # (``finished`` may have taken it meanwhile, on the event loop)
            if future is not None:
                await asyncio.wrap_future(future)

    def finished(self) -> list[Verdict]:
        """The verdicts that are in, taken off the queue."""
        done = [key for key, future in self.pending.items() if future.done()]
        return [verdict for key in done for verdict in self._take(key)]

    def _take(self, key: tuple[int, Any]) -> list[Verdict]:
        future = self.pending.pop(key)
        self.deferred.discard(key)
        if future.cancelled() or isinstance(future.exception(), CancelledError):  # (its replay was dropped)
            return []
        verdicts = future.result()
        for verdict in verdicts:
            self.seconds[verdict.round] = self.seconds.get(verdict.round, 0.0) + verdict.seconds
            self.counts[verdict.round] = self.counts.get(verdict.round, 0) + 1
            if verdict.ok and not verdict.error:
                self.checked_peers.add(verdict.peer_id)
                self.coverage.passed(verdict.peer_id)
        return verdicts

    def costs(self, round_index: int) -> dict[str, float | int]:
        """The replays judged for ``round_index`` by its merge, and those left to judge after it (``deferred``)."""
        late = sum(1 for key in self.deferred if key[0] == round_index)
        for old in [r for r in self.counts if r < round_index]:  # (verdicts of merged rounds that came late)
            self.counts.pop(old, None), self.seconds.pop(old, None)
        return {"results": self.counts.pop(round_index, 0), "replay_seconds": self.seconds.pop(round_index, 0.0),
                **({"deferred": late} if late else {})}
