"""Training that many simulated peers share: a task built once, results kept, on this machine or the browser's engine.

A unit's result is a function of the weights message it starts from, the unit and its seed (the job's round, slot,
unit, seed, episodes and progress), so whichever peer or process trains it gives the same bytes: ``Trainer`` keeps
results by that key (``Retention`` says which) and hands a kept one to the next peer given the same unit (a backup
copy, a later session of the same package). It trains on one engine:

* ``native``: ``runtime.peer.Peer``, the Python a browser's worker runs, on this machine's numpy;
* ``pyodide``: ``server.browser_assets.engines.PyodideEngine``, the browser's own engine under Node, which gives a
  page's bytes (a relay that replays on Pyodide refuses results of other engines for tasks whose units part ways
  across engines).

With ``workers`` = 0 it trains in this process; else in a pool of that many processes (one BLAS thread each: on these
small models two BLAS threads per process were 2-7x slower than one, more so beside a busy relay), for benches that
train a round's units at once (``train_all``).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime import wire
from runtime.peer import Peer
from runtime.protocol import Job
from runtime.tasks.base import TaskError
from runtime.tasks.loader import module_name_for_file, task_class
from runtime.weights import WeightSpec
from server.browser_assets import engines

BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
FILE_TASK_PREFIX = module_name_for_file(Path("x")).removesuffix("x")  # "peertrain_task_"
TRAINING_ENGINES = ("native", "pyodide")
STALE = "assignment is for round"  # how the runtime refuses weights of another round than the job's

Key = tuple[str, int, int, int, int, int, float]  # (sha256 of the weights message, round, slot, unit, seed, ...)
Work = tuple[Job, bytes, bytes | None]  # a job, the weights message it trains from, the unit's data


@dataclass(frozen=True)
class Retention:
    """Which results a ``Trainer`` keeps."""

    rounds: int | None = None  # those of the newest N rounds (older rounds are merged: no copy of them comes)
    first_round_only: bool = False  # only round 0's: every session of a package starts from the same weights
    entries: int | None = None  # at most this many


class _Engine:
    """What trains: the task's runtime (native) or the browser's engine, with the weights it holds."""

    def __init__(self, task_info: dict[str, Any], engine: str) -> None:
        self.task_info = task_info
        self.trainer: Peer | engines.PyodideEngine = engines.PyodideEngine() if engine == "pyodide" else \
            Peer(task_info)
        self.held: str | None = None  # the digest of the weights message the runtime holds

    def train(self, job: Job, message: bytes, digest: str, unit: bytes | None) -> bytes:
        if isinstance(self.trainer, engines.PyodideEngine):  # (it is handed the weights with every job)
            return self.trainer.train(self.task_info, job, message, unit)
        if self.held != digest:
            self.trainer.set_weights(message)
            self.held = digest
        return bytes(self.trainer.train(job, unit))

    def close(self) -> None:
        if isinstance(self.trainer, engines.PyodideEngine):
            self.trainer.close()


_worker: list[_Engine] = []  # in a training process: its engine


def _start_worker(task_info: dict[str, Any], source: str | None, engine: str) -> None:
    if source:  # a task from a file: import it under the name the parent's loader gave it
        task_class(source)
    _worker[:] = [_Engine(task_info, engine)]


def _train_in_worker(job: Job, message: bytes, digest: str, unit: bytes | None) -> bytes:
    return _worker[0].train(job, message, digest, unit)


class Trainer:
    """The training of one task on one engine (see the module's text); ``close`` ends its processes or engine."""

    def __init__(self, task_info: dict[str, Any], *, engine: str = "native", workers: int = 0,
                 keep: Retention | None = None) -> None:
        if engine not in TRAINING_ENGINES:
            raise ValueError(f"peers train on {' or '.join(TRAINING_ENGINES)}, not {engine!r}")
        self.task_info, self.engine, self.keep = task_info, engine, keep or Retention()
        self.spec = WeightSpec.from_json(task_info["spec"])
        self.cache: dict[Key, bytes] = {}
        self.vectors: dict[str, np.ndarray] = {}  # the global weights by message digest (the latest only)
        self.trained = self.reused = 0
        self.pool: ProcessPoolExecutor | None = None
        self.local: _Engine | None = None
        if workers <= 0:
            self.local = _Engine(task_info, engine)
            return
        for name in BLAS_THREADS:  # read by the processes started from here on (BLAS reads it when it loads)
            os.environ.setdefault(name, "1")
        module = sys.modules.get(str(task_info["task_import"]).partition(":")[0])
        source = getattr(module, "__file__", None) if module and module.__name__.startswith(FILE_TASK_PREFIX) else None
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_start_worker, initargs=(task_info, source, engine))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
        if self.local is not None:
            self.local.close()

    @staticmethod
    def key(job: Job, message: bytes) -> Key:
        return (hashlib.sha256(message).hexdigest(), job.round, job.slot, job.unit_index, job.unit_seed, job.episodes,
                job.progress)

    def global_weights(self, message: bytes) -> np.ndarray:
        """The weights a weights message carries (decoded once per message)."""
        digest = hashlib.sha256(message).hexdigest()
        if digest not in self.vectors:
            self.vectors = {digest: wire.decode(message, expect_spec=self.spec)[1]}
        return self.vectors[digest]

    def kept(self, job: Job, message: bytes) -> bytes | None:
        """The result of ``job`` from ``message`` if one is kept (not counted)."""
        return self.cache.get(self.key(job, message))

    def train(self, job: Job, message: bytes, unit: bytes | None) -> bytes:
        """The result of ``job`` trained from the weights ``message`` on ``unit`` (or the one kept)."""
        key = self.key(job, message)
        if key in self.cache:
            self.reused += 1
            return self.cache[key]
        if self.local is not None:
            body = self.local.train(job, message, key[0], unit)
        else:
            assert self.pool is not None
            body = self.pool.submit(_train_in_worker, job, message, key[0], unit).result()
        self.store(key, body)
        return body

    def train_all(self, work: Sequence[Work]) -> list[bytes | None]:
        """The results of ``work`` (in the pool, all at once), in order; None for a job the weights fetched for it
        cannot train (a ban's undo took its round back meanwhile: the runtime refuses weights of another round, as
        a page's does)."""
        keys = [self.key(job, message) for job, message, _ in work]
        results: dict[int, bytes | Future[bytes]] = {}
        for index, (key, (job, message, unit)) in enumerate(zip(keys, work, strict=True)):
            if key in self.cache:
                self.reused += 1
                results[index] = self.cache[key]
            elif self.pool is not None:
                results[index] = self.pool.submit(_train_in_worker, job, message, key[0], unit)
            else:
                future: Future[bytes] = Future()
                try:
                    assert self.local is not None
                    future.set_result(self.local.train(job, message, key[0], unit))
                except (TaskError, engines.EngineError) as error:
                    future.set_exception(error)
                results[index] = future
        out: list[bytes | None] = []
        for index, key in enumerate(keys):
            value = results[index]
            if isinstance(value, Future):
                try:
                    value = value.result()
                except (TaskError, engines.EngineError) as error:
                    if STALE not in str(error):
                        raise
                    out.append(None)
                    continue
            if key not in self.cache:
                self.store(key, value)
            out.append(value)
        return out

    def store(self, key: Key, body: bytes) -> None:
        """Count a trained result and keep it where ``keep`` says."""
        self.trained += 1
        keep, round_index = self.keep, key[1]
        if keep.first_round_only and round_index != 0:
            return
        if keep.rounds is not None:  # (older rounds are merged: none of their units comes again)
            self.cache = {k: v for k, v in self.cache.items() if k[1] > round_index - keep.rounds}
        if keep.entries is None or len(self.cache) < keep.entries:
            self.cache[key] = body
