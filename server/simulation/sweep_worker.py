"""What a sweep worker runs: one whole session, from a package folder or its files shipped as bytes.

The same functions serve every engine of ``server.simulation.sweep``: in-process, a process of a local pool, or a
Ray worker on any machine of a cluster. A job never raises: a failure comes back as a ``JobResult`` with
``error`` (and the worker's traceback), so the driver can name the session that failed whatever the engine.

Sessions are deterministic given the package and the ``SessionConfig``, with one exception this module removes:
OpenBLAS's float32 matmuls give different last bits with 1 and with 2 threads, so every session here trains with
one BLAS/OpenMP thread (``one_blas_thread``), in every process, whatever ``OPENBLAS_NUM_THREADS`` says.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server.session.config import SessionConfig
from server.session.metrics import RoundLog
from server.session.package import Package
from server.session.session import Session
from server.simulation.uploads import SimulatedUploads

# Environment for worker processes (a pool's spawned processes, Ray's runtime_env): no BLAS threads to start.
WORKER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# (job index, rounds done, the session's label, the watched metric after this round or None)
Report = Callable[[int, int, str, float | None], None]


class SweepError(RuntimeError):
    """A sweep could not run or one of its sessions failed; ``label`` names the session (None: the sweep)."""

    def __init__(self, message: str, *, label: str | None = None, worker_traceback: str | None = None) -> None:
        super().__init__(message)
        self.label = label
        self.worker_traceback = worker_traceback


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """One BLAS and OpenMP thread inside the block: the bits of a matmul depend on the thread count."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


def run_round(session: Session, uploads: SimulatedUploads | None = None) -> dict[str, Any]:
    """Train every assignment of the current round in-process, pass each result through the session's codec as a
    peer's upload (``uploads`` keeps the simulated peers' residuals from round to round), complete the round."""
    started = time.perf_counter()
    uploads = uploads or SimulatedUploads()
    results = [(a, uploads.arrived(session, a, session.task.train_unit(session.weights, session.work_unit(a))))
               for a in session.assignments()]
    return session.complete_round(results, train_seconds=time.perf_counter() - started)


def train_session(package: Package, config: SessionConfig, directory: Path | None,
                  on_round: Callable[[Session, dict[str, Any]], Any] | None = None,
                  round_log: RoundLog | None = None) -> Session:
    """A whole session (checkpoints in ``directory`` as it goes, when given, and its rounds in ``round_log``) with one
    BLAS thread."""
    with one_blas_thread():
        session = Session.create(package, config, directory=directory, round_log=round_log)
        uploads = SimulatedUploads()
        while not session.done:
            entry = run_round(session, uploads)
            if on_round is not None:
                on_round(session, entry)
    return session


@dataclass(frozen=True)
class SessionJob:
    """One session for a worker: its place in the sweep, its folder name, its config, and whether the worker should
    ship the session folder's files back (the driver writes them under its own output folder)."""

    index: int
    name: str
    config: SessionConfig
    package_path: str | None = None  # a pool's workers share the driver's filesystem; Ray's get PackageFiles
    keep_files: bool = True
    work_dir: str | None = None  # scratch folder the driver chose (a pool's); None: the worker's own temporary one


@dataclass
class JobResult:
    """What comes back to the driver: the session's outcome, or the error that ended it."""

    index: int
    name: str
    label: str
    error: str | None = None
    worker_traceback: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    weights: np.ndarray | None = None
    best_weights: np.ndarray | None = None
    best_metric: float | None = None
    best_round: int | None = None
    stopped: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    files: dict[str, bytes] | None = None  # the session folder: relative path -> bytes

    @classmethod
    def of(cls, job: SessionJob, session: Session, seconds: float, files: dict[str, bytes] | None) -> JobResult:
        return cls(index=job.index, name=job.name, label=job.config.name, history=session.history,
                   weights=session.weights, best_weights=session.best_weights, best_metric=session.best_metric,
                   best_round=session.best_round, stopped=session.stopped, summary=session.describe(),
                   seconds=seconds, files=files)


@dataclass(frozen=True)
class PackageFiles:
    """A package folder as bytes, for workers that may not see the driver's filesystem (a Ray cluster).

    A task given as a ``.py`` file travels with it (``task_file``); a task given as ``package.module`` must be
    importable on the workers."""

    fingerprint: str
    files: dict[str, bytes]  # relative posix path -> bytes
    task_file: tuple[str, bytes] | None = None  # the task file's name and source

    @classmethod
    def of(cls, package: Package) -> PackageFiles:
        root = Path(package.path)
        files = read_tree(root)
        task_file = None
        location = str(package.manifest["task"]).partition(":")[0]
        if location.endswith(".py") or "/" in location:
            source = Path(package.manifest.get("task_source") or location)
            task_file = (source.name, source.read_bytes())
        return cls(fingerprint=package.fingerprint, files=files, task_file=task_file)

    def unpack(self, folder: Path) -> Package:
        """Write the package under ``folder`` (the task file beside it, the manifest pointing there) and load it."""
        root = folder / "package"
        write_tree(root, self.files)
        if self.task_file is not None:
            name, source = self.task_file
            task_path = folder / "task" / name
            task_path.parent.mkdir(parents=True, exist_ok=True)
            task_path.write_bytes(source)
            manifest = json.loads((root / "manifest.json").read_text())
            _, colon, class_name = str(manifest["task"]).partition(":")
            manifest["task"] = str(task_path) + colon + class_name  # (the stored fingerprint is kept as it is)
            manifest["task_source"] = str(task_path)
            (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        package = Package.load(root)
        if package.fingerprint != self.fingerprint:
            raise SweepError(f"the shipped package has fingerprint {package.fingerprint}, not {self.fingerprint}")
        return package


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, by relative posix path."""
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = root / relative
        if not path.resolve().is_relative_to(root.resolve()):
            raise SweepError(f"refusing to write {relative!r} outside {root}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def run_job(job: SessionJob, load: Callable[[Path], Package], report: Report | None) -> JobResult:
    """Run ``job`` in a temporary folder (the package copy, if any, and the session's checkpoints); never raises."""
    started = time.perf_counter()
    label = job.config.name

    def on_round(session: Session, entry: dict[str, Any]) -> None:
        if report is not None:
            value = entry["metrics"].get(session.metric)
            report(job.index, session.round, label, value if isinstance(value, int | float) else None)

    try:
        with job_folder(job.work_dir) as folder:
            package = load(folder)
            directory = folder / "session" if job.keep_files else None
            session = train_session(package, job.config, directory, on_round)
            files = read_tree(directory) if directory is not None else None
        return JobResult.of(job, session, time.perf_counter() - started, files)
    except Exception as error:  # (everything goes back to the driver, which names the session)
        return JobResult(index=job.index, name=job.name, label=label, error=f"{type(error).__name__}: {error}",
                         worker_traceback=traceback.format_exc(), seconds=time.perf_counter() - started)


@contextlib.contextmanager
def job_folder(work_dir: str | None) -> Iterator[Path]:
    """The job's scratch folder: ``work_dir`` when the driver gave one (it removes its parent whatever happens to the
    worker), else a temporary folder of this machine's; emptied when the job ends."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="peertrain-sweep-") as temporary:
            yield Path(temporary)
        return
    folder = Path(work_dir)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- a local process pool's worker side ---------------------------------------------------------------------------
_POOL_QUEUE: Any = None  # the multiprocessing queue rounds are reported on (set by pool_initializer)


def pool_initializer(queue: Any) -> None:
    global _POOL_QUEUE
    _POOL_QUEUE = queue


def _pool_report(index: int, rounds: int, label: str, value: float | None) -> None:
    if _POOL_QUEUE is not None:
        _POOL_QUEUE.put((index, rounds, label, value))


def pool_job(job: SessionJob) -> JobResult:
    """A pool worker's entry point: the package from the shared filesystem, rounds reported on the queue."""
    path = job.package_path
    if path is None:
        return JobResult(index=job.index, name=job.name, label=job.config.name, error="the job names no package")
    return run_job(job, lambda _folder: Package.load(Path(path)), _pool_report)
