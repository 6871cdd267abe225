"""Sweeps: many simulated sessions as parallel tasks, in-process, on a local process pool or on Ray.

    specs = [SessionSpec(package, SessionConfig(merge="fedavg", participants=2, passes=2), "fedavg"),
             SessionSpec(package, SessionConfig(merge="fedavgm", participants=2, passes=2), "fedavgm")]
    outcomes = run_sessions(specs, engine="pool", workers=2, out=Path("runs/sweep"))

Engines: ``local`` runs the sessions in this process one after another (checkpoints written as they go, as the
simulator always did); ``pool`` in a pool of ``workers`` spawned processes (default: one per CPU; a pool of one
runs in-process); ``ray`` as Ray tasks on an embedded instance (``address=None``) or on a cluster
(``address="HEAD:6379"``, see ``server.simulation.sweep_ray``). Whatever the engine, a session gives the same bits:
the same history (all but the wall-clock fields ``time`` and ``seconds``), the same final and best weights;
every session trains with one BLAS thread (``sweep_worker.one_blas_thread``).

Workers run each session in a temporary folder and ship its files back; the driver writes them to
``out/NAME/`` (history.jsonl, session.json naming the driver's package folder, the checkpoints), so
``Session.restore`` of that folder works as for a session run here. One progress bar counts every session's
rounds. A session that fails raises ``SweepError`` naming it, with the worker's traceback attached.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue as queue_module
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from server.session import checkpoint_files as checkpoint
from server.session.config import SessionConfig
from server.session.metrics import RoundLog
from server.session.package import Package
from server.session.session import Session
from server.simulation.sweep_worker import (
    WORKER_ENV,
    JobResult,
    SessionJob,
    SweepError,
    pool_initializer,
    pool_job,
    train_session,
    write_tree,
)

__all__ = ["ENGINES", "Engine", "SessionOutcome", "SessionSpec", "SweepError", "describe_engine", "run_sessions"]

Engine = Literal["local", "pool", "ray"]
ENGINES: tuple[Engine, ...] = ("local", "pool", "ray")
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class SessionSpec:
    """One session of a sweep: the package (a loaded ``Package`` or its folder), how it runs, its folder's name."""

    package: Package | Path
    config: SessionConfig
    name: str  # the session's folder under the sweep's ``out``

    @property
    def label(self) -> str:
        return self.config.name


@dataclass
class SessionOutcome:
    """A finished session, whichever engine ran it."""

    name: str
    label: str
    history: list[dict[str, Any]]
    weights: np.ndarray  # the final global weights (float32)
    best_weights: np.ndarray
    best_metric: float | None
    best_round: int | None  # None: the initial weights were the best
    stopped: str | None  # why it ended early, if it did
    summary: dict[str, Any]  # ``Session.describe()``
    seconds: float  # wall-clock time of the session in its worker
    directory: Path | None  # where its folder was written (None without ``out``)
    session: Session | None  # the session on the driver: the one that ran, or restored from ``directory``

    def describe(self) -> dict[str, Any]:
        return self.summary


def describe_engine(engine: Engine, workers: int | None, address: str | None, sessions: int) -> str:
    """How ``run_sessions`` will run ``sessions`` sessions, in words (for logs)."""
    engine, count = effective_engine(engine, workers, sessions)
    if engine == "local":
        return "in-process"
    if engine == "pool":
        return f"on a pool of {count} processes"
    where = "an embedded Ray instance" if address in (None, "local") else f"the Ray cluster at {address}"
    return f"on {where}" + (f" ({workers} at a time)" if workers else "")


def effective_engine(engine: Engine, workers: int | None, sessions: int) -> tuple[Engine, int]:
    if engine not in ENGINES:
        raise SweepError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    if workers is not None and workers < 1:
        raise SweepError(f"workers must be 1 or more, got {workers}")
    count = min(workers or os.cpu_count() or 1, max(sessions, 1))
    if engine == "pool" and count == 1:
        return "local", 1  # (a process of its own would only add its start-up)
    return engine, count


def run_sessions(specs: Sequence[SessionSpec], *, engine: Engine = "local", workers: int | None = None,
                 address: str | None = None, progress: bool = True, out: Path | None = None,
                 round_log: RoundLog | None = None) -> list[SessionOutcome]:
    """Run every session of ``specs``; the outcomes come in the order of ``specs``.

    With ``out``, session i's folder is ``out/specs[i].name`` (written on this machine whatever the engine), and
    ``round_log`` gets its rounds (``server.session.metrics``: always from this process, the driver: as they come in
    process, when a worker's session comes back on a pool or on Ray).
    ``workers``: processes of the pool (default one per CPU), CPUs of an embedded Ray instance, or sessions in
    flight at once on a cluster. ``address``: the Ray cluster to join (``engine="ray"`` only). Each config is
    checked here first (the merge guard, the aggregator's assumptions), before any worker starts."""
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise SweepError(f"two sessions share a folder name: {sorted(n for n in set(names) if names.count(n) > 1)}")
    if address is not None and engine != "ray":
        raise SweepError("a Ray address needs engine='ray'")
    engine, count = effective_engine(engine, workers, len(specs))
    loaded: dict[Path, Package] = {}  # (a folder named by several specs is loaded once, and shipped once)
    packages = [_load(spec.package, loaded) for spec in specs]
    rounds = [Session(package, spec.config).num_rounds for spec, package in zip(specs, packages, strict=True)]
    out = Path(out) if out is not None else None
    outcomes: list[SessionOutcome | None] = [None] * len(specs)
    with RoundsBar(specs, rounds, enabled=progress, parallel=engine != "local") as bar:
        if engine == "local":
            for index, (spec, package) in enumerate(zip(specs, packages, strict=True)):
                outcomes[index] = _run_here(index, spec, package, out, bar, round_log)
            return [o for o in outcomes if o is not None]

        def collect(result: JobResult) -> None:
            if result.error is not None:
                raise SweepError(f"session {result.label!r} failed: {result.error}", label=result.label,
                                 worker_traceback=result.worker_traceback)
            bar.finished(result.index)
            outcomes[result.index] = _outcome(result, packages[result.index], out, round_log)

        jobs = [SessionJob(index=i, name=spec.name, config=spec.config, keep_files=out is not None,
                           package_path=str(Path(package.path).resolve()) if engine == "pool" else None)
                for i, (spec, package) in enumerate(zip(specs, packages, strict=True))]
        if engine == "pool":
            _run_pool(jobs, count, bar.report, collect)
        else:
            from server.simulation.sweep_ray import run_on_ray

            run_on_ray(jobs, packages, address=address, workers=workers, report=bar.report, on_result=collect)
    return [o for o in outcomes if o is not None]


def _load(package: Package | Path, loaded: dict[Path, Package]) -> Package:
    if isinstance(package, Package):
        return package
    path = Path(package).resolve()
    if path not in loaded:
        loaded[path] = Package.load(path)
    return loaded[path]


def _run_here(index: int, spec: SessionSpec, package: Package, out: Path | None, bar: RoundsBar,
              round_log: RoundLog | None = None) -> SessionOutcome:
    started = time.perf_counter()
    directory = out / spec.name if out is not None else None
    bar.describe(spec.label)

    def on_round(session: Session, entry: dict[str, Any]) -> None:
        value = entry["metrics"].get(session.metric)
        bar.report(index, session.round, spec.label, value if isinstance(value, int | float) else None)

    try:
        session = train_session(package, spec.config, directory, on_round, round_log if directory else None)
    except Exception as error:
        raise SweepError(f"session {spec.label!r} failed: {type(error).__name__}: {error}", label=spec.label) \
            from error
    bar.finished(index)
    return SessionOutcome(name=spec.name, label=spec.label, history=session.history, weights=session.weights,
                          best_weights=session.best_weights, best_metric=session.best_metric,
                          best_round=session.best_round, stopped=session.stopped, summary=session.describe(),
                          seconds=time.perf_counter() - started, directory=directory, session=session)


def _outcome(result: JobResult, package: Package, out: Path | None, round_log: RoundLog | None) -> SessionOutcome:
    """A worker's result on the driver: its folder written under ``out`` and restored from there (its rounds to
    ``round_log``: a new session there, whatever an earlier sweep left in the folder)."""
    directory = session = None
    if out is not None and result.files is not None:
        directory = out / result.name
        write_session_folder(directory, result.files, package)
        session = Session.restore(directory, package)
        if round_log is not None:
            round_log.begin(session, new=True)
    assert result.weights is not None and result.best_weights is not None
    return SessionOutcome(name=result.name, label=result.label, history=result.history, weights=result.weights,
                          best_weights=result.best_weights, best_metric=result.best_metric,
                          best_round=result.best_round, stopped=result.stopped, summary=result.summary,
                          seconds=result.seconds, directory=directory, session=session)


def write_session_folder(directory: Path, files: dict[str, bytes], package: Package) -> None:
    """A worker's session folder, written here: its checkpoints replace what a previous run left in ``directory``,
    and ``session.json`` names this machine's package folder (as a session run here would)."""
    for stale in (checkpoint.ROUNDS_DIR, checkpoint.BEST_DIR):
        shutil.rmtree(directory / stale, ignore_errors=True)
    write_tree(directory, files)
    stored = checkpoint.read_session_config(directory)
    stored["package"] = str(Path(package.path).resolve())
    checkpoint.write_session_config(directory, stored)


@contextmanager
def worker_environment() -> Iterator[None]:
    """``WORKER_ENV`` in this process's environment while a pool spawns its workers (they import numpy before any
    initializer runs), restored afterwards."""
    saved = {name: os.environ.get(name) for name in WORKER_ENV}
    os.environ.update(WORKER_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_pool(jobs: Sequence[SessionJob], workers: int, report: Callable[..., None],
              on_result: Callable[[JobResult], None]) -> None:
    """Run ``jobs`` on a pool of ``workers`` spawned processes; rounds come back on a queue."""
    context = multiprocessing.get_context("spawn")  # (fork: unsafe with threads, and numpy's state is inherited)
    rounds = context.Queue()
    # The jobs' scratch folders live here, so that whatever ends a worker, nothing is left behind.
    with tempfile.TemporaryDirectory(prefix="peertrain-sweep-") as scratch, worker_environment():
        jobs = [dataclasses.replace(job, work_dir=str(Path(scratch) / str(job.index))) for job in jobs]
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=pool_initializer,
                                   initargs=(rounds,))
        finished = False
        try:
            futures: dict[Future[JobResult], SessionJob] = {pool.submit(pool_job, job): job for job in jobs}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
                _drain(rounds, report)
                for future in done:
                    job = futures[future]
                    try:
                        result = future.result()
                    except Exception as error:  # a worker that died (killed, out of memory)
                        raise SweepError(f"session {job.config.name!r} failed: its worker process ended: "
                                         f"{type(error).__name__}: {error}", label=job.config.name) from None
                    on_result(result)
            finished = True
        finally:
            if not finished:  # (a failure or Ctrl-C: the sessions still running would be thrown away)
                _terminate_workers(pool)
            pool.shutdown(wait=True, cancel_futures=True)
            rounds.close()
            rounds.join_thread()


def _drain(rounds: Any, report: Callable[..., None]) -> None:
    while True:
        try:
            report(*rounds.get_nowait())
        except queue_module.Empty:
            return


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    """End the pool's processes now rather than wait for the sessions they run."""
    terminate = getattr(pool, "terminate_workers", None)  # (Python 3.14)
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


class RoundsBar:
    """One tqdm bar over every session's rounds; a session that stops early adds its remaining rounds when done."""

    def __init__(self, specs: Sequence[SessionSpec], rounds: Sequence[int], *, enabled: bool, parallel: bool) -> None:
        self.specs, self.rounds, self.parallel = specs, list(rounds), parallel
        self.counted = [0] * len(specs)
        self.done = 0
        self.bar = tqdm(total=sum(rounds), unit="round", disable=not enabled, dynamic_ncols=True)
        if parallel:  # (one after another, the bar names the session running)
            self.bar.set_description(f"0/{len(specs)} sessions")

    def __enter__(self) -> RoundsBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def describe(self, text: str) -> None:
        self.bar.set_description(text)

    def report(self, index: int, rounds: int, label: str, value: float | None) -> None:
        step = max(0, min(rounds, self.rounds[index]) - self.counted[index])
        self.counted[index] += step
        self.bar.update(step)
        self.bar.set_postfix_str(f"{label}: {'-' if value is None else f'{value:.4g}'}"[:40])

    def finished(self, index: int) -> None:
        self.bar.update(self.rounds[index] - self.counted[index])
        self.counted[index] = self.rounds[index]
        self.done += 1
        if self.parallel:
            self.bar.set_description(f"{self.done}/{len(self.specs)} sessions")
