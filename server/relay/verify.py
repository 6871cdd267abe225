"""Checking results by replay: the host trains a unit again and compares.

A unit is a deterministic function of (global weights, the unit's data or episode seed, the task's settings),
so an honest result can be reproduced: bit for bit between Pyodide peers on the CPU, within a small relative
error between a browser and native CPython (different float summation orders in the matmul kernels). The
host replays a result with the same code a browser runs (``runtime.peer.Peer``, built from the same task
description) and accepts it when, on the update,

    |result - replay| <= rtol * |replay - global| + atol

A cheat cannot stay inside that bound and still move the model its way: noise, a flipped, scaled or zeroed
update (a free-rider) all differ from the replay by a large fraction of the update itself. Which results are
replayed: every peer's first result, a seeded random share (``fraction``), and every result a check or the
aggregator flags as an outlier. Replays run in one worker thread with their own task object (the merge's
validation uses the session's), so verification overlaps the round; a round merges only after its pending
replays finished. A replay needs only the job, so the relay starts the replay of a unit it will check when it
hands the unit out (the peer's first, or the sampled share: both known then); the check is a comparison.
Host replay does not depend on who the peers are, so many identities do not help a cheat.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime import wire
from runtime.codec import Codec
from runtime.peer import Peer

# Calibrated from browser results against native replays (BENCHMARKS.md, "Replay tolerance"): the largest
# relative deviation seen was far below this; the margin absorbs other browsers' summation orders.
DEFAULT_VERIFY_RTOL = 1e-2
DEFAULT_VERIFY_ATOL = 1e-6
DEFAULT_VERIFY_FRACTION = 0.1
DISPUTE = "two copies of the unit disagree"  # the reason of a replay that decides between two copies


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


def sampled(seed: int, round_index: int, slot: int, fraction: float, purpose: str = "verify") -> bool:
    """A seeded coin per (round, slot): the same session draws the same share, and a peer cannot tell which.
    ``purpose`` keeps the coins of replays and of second copies (redundancy) apart."""
    if fraction >= 1:
        return True
    digest = hashlib.sha256(f"{purpose}:{seed}:{round_index}:{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


@dataclass(frozen=True)
class Replay:
    """A unit trained on the host: its weights, the global weights it started from, and the seconds it took."""

    weights: np.ndarray
    global_weights: np.ndarray
    seconds: float


class Verifier:
    """Replays units in one worker thread with its own ``Peer`` (the browser's code path).

    A replay needs only the job, never the result, so the relay starts the replay of a unit it will check
    when it hands the unit out (``replay``), and the check (``judge``) is a comparison when the result comes."""

    def __init__(self, task_info: dict[str, Any], *, rtol: float, atol: float) -> None:
        self.task_info = task_info
        self.rtol, self.atol = rtol, atol
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay")
        self._peer: Peer | None = None  # built in the worker thread, used only there

    def replay(self, *, job: dict[str, Any], weights_message: bytes, unit_message: bytes | None) -> Future[Replay]:
        return self._pool.submit(self._train, job, weights_message, unit_message)

    def judge(self, replay: Future[Replay], *, job: dict[str, Any], results: dict[str, np.ndarray],
              reason: str, count_seconds: bool = True) -> Future[list[Verdict]]:
        """Each peer's result of ``job`` against ``replay`` once it is done (two when a unit's copies disagree);
        ``count_seconds``: this judgement carries the replay's cost (the first judgement of a replay)."""
        verdicts: Future[list[Verdict]] = Future()

        def compare(done: Future[Replay]) -> None:
            try:
                replayed = done.result()
                seconds = replayed.seconds if count_seconds else 0.0
                found = []
                for peer_id, result in results.items():
                    ok, relative = matches(result, replayed.weights, replayed.global_weights, rtol=self.rtol,
                                           atol=self.atol)
                    found.append(Verdict(int(job["round"]), int(job["slot"]), peer_id, ok, relative, seconds, reason))
                    seconds = 0.0  # one replay, counted once
                verdicts.set_result(found)
            except BaseException as error:  # (cancelled when the relay closes)
                verdicts.set_exception(error)

        replay.add_done_callback(compare)
        return verdicts

    def submit(self, *, job: dict[str, Any], weights_message: bytes, unit_message: bytes | None,
               results: dict[str, np.ndarray], reason: str) -> Future[list[Verdict]]:
        """Replay ``job`` now and judge ``results`` against it."""
        return self.judge(self.replay(job=job, weights_message=weights_message, unit_message=unit_message),
                          job=job, results=results, reason=reason)

    def _train(self, job: dict[str, Any], weights_message: bytes, unit_message: bytes | None) -> Replay:
        started = time.perf_counter()
        if self._peer is None:
            self._peer = Peer(self.task_info)
        peer = self._peer
        if peer.weights_round != job["round"]:
            peer.set_weights(weights_message)
        assert peer.weights is not None
        _, replay = wire.result_weights(peer.train(json.dumps(job), unit_message), peer.weights,
                                        codec=Codec.from_json(job["codec"]) if job.get("codec") else Codec())
        return Replay(replay, peer.weights, time.perf_counter() - started)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ReplayQueue:
    """The replays of the open rounds: which results to replay, the pending ones, the peers already checked."""

    def __init__(self, verifier: Verifier, *, fraction: float, seed: int) -> None:
        self.verifier, self.fraction, self.seed = verifier, fraction, seed
        self.pending: dict[tuple[int, Any], Future[list[Verdict]]] = {}  # (round, which result(s))
        # (round, slot) -> a replay started when the slot was handed out, and whether a judgement counted it
        self.prepared: dict[tuple[int, int], tuple[Future[Replay], list[bool]]] = {}
        self.checked_peers: set[str] = set()  # peers with a result that passed a replay
        self.first_queued: set[str] = set()  # peers whose first result is (or was) queued
        self.seconds: dict[int, float] = {}  # replay seconds per round (the history's costs)
        self.counts: dict[int, int] = {}  # results replayed per round

    def reason(self, peer_id: str, round_index: int, slot: int, *, outlier: bool = False) -> str | None:
        """Why this result should be replayed, or None."""
        if outlier:
            return "outlier"
        if peer_id not in self.first_queued:
            self.first_queued.add(peer_id)
            return "first result of the peer"
        return "sampled" if self.fraction > 0 and sampled(self.seed, round_index, slot, self.fraction) else None

    def will_check(self, peer_id: str, round_index: int, slot: int) -> bool:
        """At hand-out: whether this slot's result will be replayed (the peer's first, or the sampled share)."""
        return peer_id not in self.first_queued or (self.fraction > 0 and
                                                     sampled(self.seed, round_index, slot, self.fraction))

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
        for key in [key for key in self.prepared if key[0] < round_index]:
            self.prepared.pop(key)[0].cancel()

    def queue(self, round_index: int, key: Any, future: Future[list[Verdict]]) -> None:
        self.pending[(round_index, key)] = future

    async def wait(self, round_index: int) -> None:
        """Until the replays queued for ``round_index`` are done (their verdicts stay for ``finished``)."""
        for key in [key for key in self.pending if key[0] == round_index]:
            future = self.pending.get(key)  # (``finished`` may have taken it meanwhile, on the event loop)
            if future is not None:
                await asyncio.wrap_future(future)

    def finished(self) -> list[Verdict]:
        """The verdicts that are in, taken off the queue."""
        done = [key for key, future in self.pending.items() if future.done()]
        return [verdict for key in done for verdict in self._take(key)]

    def _take(self, key: tuple[int, Any]) -> list[Verdict]:
        verdicts = self.pending.pop(key).result()
        for verdict in verdicts:
            self.seconds[verdict.round] = self.seconds.get(verdict.round, 0.0) + verdict.seconds
            self.counts[verdict.round] = self.counts.get(verdict.round, 0) + 1
            if verdict.ok:
                self.checked_peers.add(verdict.peer_id)
        return verdicts

    def costs(self, round_index: int) -> dict[str, float | int]:
        return {"results": self.counts.pop(round_index, 0), "replay_seconds": self.seconds.pop(round_index, 0.0)}
