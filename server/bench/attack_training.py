"""Training for the native peers of ``peertrain bench attacks`` (``attack_peers``): every honest result, and the
honest result an attacker starts from, is trained here.

A unit is a function of the weights, the unit and its seed, so which peer (or process) trains it does not matter:
a round's units train in a pool of ``workers`` processes, shared by the run's peers. Each process trains on one
engine:

* ``native``: ``runtime.peer.Peer`` (the Python a browser's worker runs) on this machine's numpy, one BLAS thread
  (on these small models two BLAS threads per process were 2-7x slower than one, more so beside a busy relay);
* ``pyodide``: ``server.browser_assets.engines.PyodideEngine``, the browser's own engine under Node, which gives a
  page's bytes. A relay that replays on Pyodide refuses results trained on another engine for a task whose units
  part ways across engines (bytetext, CartPole: its ``GET /api/task`` says ``devices: ["cpu"]``), so there the
  peers train as a page does; elsewhere natively, which is faster.

Round 0 starts from the package's initial weights in every run, so its honest results are kept and reused: the
same bytes a peer would upload (its ``seconds`` metric aside).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from runtime import wire
from runtime.peer import Peer
from runtime.tasks.base import TaskError
from runtime.tasks.loader import module_name_for_file, task_class
from runtime.weights import WeightSpec
from server.browser_assets import engines

CACHE_ENTRIES = 256
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
FILE_TASK_PREFIX = module_name_for_file(Path("x")).removesuffix("x")  # "peertrain_task_"
TRAINING_ENGINES = ("native", "pyodide")


def peer_engine(task_info: dict[str, Any], replay_engine: str) -> str:
    """The engine the bench's peers train on for a relay that replays on ``replay_engine``: the relay's own where it
    refuses results of other engines (its task says ``devices: ["cpu"]``), else native."""
    return replay_engine if replay_engine == "pyodide" and task_info.get("devices") == ["cpu"] else "native"


_worker: list[Any] = []  # in a training process: [Peer or PyodideEngine, task info, digest of the weights held]


def _start_worker(task_info: dict[str, Any], source: str | None, engine: str) -> None:
    if source:  # a task from a file: import it under the name the parent's loader gave it
        task_class(source)
    trainer = engines.PyodideEngine() if engine == "pyodide" else Peer(task_info)
    _worker[:] = [trainer, task_info, None]


def _train_in_worker(message: bytes, digest: str, job: dict[str, Any], unit: bytes | None) -> bytes:
    trainer, task_info, held = _worker
    if isinstance(trainer, engines.PyodideEngine):  # (it is handed the weights with every job)
        return trainer.train(task_info, job, message, unit)
    if held != digest:
        trainer.set_weights(message)
        _worker[2] = digest
    return bytes(trainer.train(job, unit))


class Trainer:
    """The training processes of one task on one engine (see the module's text); ``close`` ends them (a Pyodide
    worker exits with its process's standard input)."""

    def __init__(self, task_info: dict[str, Any], workers: int = 1, engine: str = "native") -> None:
        if engine not in TRAINING_ENGINES:
            raise ValueError(f"peers train on {' or '.join(TRAINING_ENGINES)}, not {engine!r}")
        self.spec = WeightSpec.from_json(task_info["spec"])
        self.engine = engine
        self.cache: dict[tuple[Any, ...], bytes] = {}
        self.vectors: dict[str, np.ndarray] = {}  # the global weights by message hash (the current round's)
        self.trained = self.reused = 0
        for name in BLAS_THREADS:  # read by the processes started from here on (BLAS reads it when it loads)
            os.environ.setdefault(name, "1")
        module = sys.modules.get(str(task_info["task_import"]).partition(":")[0])
        source = getattr(module, "__file__", None) if module and module.__name__.startswith(FILE_TASK_PREFIX) else None
        self.pool = ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_start_worker, initargs=(task_info, source, engine))

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)

    def global_weights(self, message: bytes, digest: str) -> np.ndarray:
        if digest not in self.vectors:
            self.vectors = {digest: wire.decode(message, expect_spec=self.spec)[1]}
        return self.vectors[digest]

    def train_all(self, work: list[tuple[bytes, str, dict[str, Any], bytes | None]]) -> list[bytes | None]:
        """The result messages of ``work`` (weights message, its digest, assignment, unit message), in order; None
        for a job the weights fetched for it cannot train (a ban's undo took its round back meanwhile: the runtime
        refuses weights of another round, as a page's does)."""
        keys = [(digest, job["round"], job["slot"], job["unit_index"], job["unit_seed"], job.get("episodes"),
                 job.get("progress")) for _, digest, job, _ in work]
        results: dict[int, bytes | Future[bytes]] = {}
        for index, (key, (message, digest, job, unit)) in enumerate(zip(keys, work, strict=True)):
            if key in self.cache:
                self.reused += 1
                results[index] = self.cache[key]
            else:
                results[index] = self.pool.submit(_train_in_worker, message, digest, job, unit)
        out: list[bytes | None] = []
        for index, key in enumerate(keys):
            value = results[index]
            if isinstance(value, Future):
                try:
                    value = value.result()
                except (TaskError, engines.EngineError) as error:
                    if "assignment is for round" not in str(error):
                        raise
                    out.append(None)
                    continue
            if key not in self.cache:
                self.trained += 1
                if key[1] == 0 and len(self.cache) < CACHE_ENTRIES:
                    self.cache[key] = value
            out.append(value)
        return out
