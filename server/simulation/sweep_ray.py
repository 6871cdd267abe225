"""The Ray engine of ``server.simulation.sweep``: sessions as Ray tasks, on an embedded instance or a cluster.

``address=None`` (or ``"local"``) starts an embedded Ray instance for the sweep and shuts it down afterwards (no
dashboard, no usage statistics sent anywhere, workers' output kept out of the terminal). Any other address joins an
existing cluster (``ray start --head`` on one machine, ``ray start --address=HEAD:6379`` on the others): the driver
checks first that the address answers, so a wrong one fails in seconds with one line.

Nothing assumes a shared filesystem: each package goes into Ray's object store once as its files' bytes
(``PackageFiles``), every task unpacks it in a temporary folder, trains, and returns the session's history,
weights and checkpoint files to the driver, which writes them. When joining a cluster the project's own code
(``runtime``, ``server``) travels too (Ray's ``py_modules``), so every machine trains with the driver's code; the
machines need Python 3.12, Ray and the host dependencies (numpy, safetensors, threadpoolctl). Rounds are reported
to a small actor the driver polls, so one progress bar counts every session's rounds.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from server.session.package import Package
from server.simulation.sweep_worker import WORKER_ENV, JobResult, PackageFiles, Report, SessionJob, SweepError, run_job

POLL_SECONDS = 0.2
CONNECT_SECONDS = 5.0  # how long the driver waits for a cluster's address to answer before giving up


class RoundSink:
    """A Ray actor (made one in ``run_on_ray``) that collects the rounds workers report; the driver drains it."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int, str, float | None]] = []

    def push(self, item: tuple[int, int, str, float | None]) -> None:
        self.items.append(item)

    def drain(self) -> list[tuple[int, int, str, float | None]]:
        items, self.items = self.items, []
        return items


def ray_job(job: SessionJob, package_files: PackageFiles, sink: Any) -> JobResult:
    """A Ray task: unpack the shipped package, run the session, report each round to ``sink``."""

    def report(index: int, rounds: int, label: str, value: float | None) -> None:
        sink.push.remote((index, rounds, label, value))

    return run_job(job, package_files.unpack, report)


def import_ray() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # (else Ray may send usage statistics out)
    try:
        import ray
    except ImportError:
        raise SweepError("--ray needs Ray: pip install 'ray>=2.40' (it comes with peertrain's host extras: "
                         "pip install -e '.[host]')") from None
    return ray


def check_reachable(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """Fail at once, in one line, when ``HOST:PORT`` (or ``ray://HOST:PORT``) does not answer: ray.init would
    otherwise retry for minutes. ``auto`` (a cluster started on this machine) is left to Ray."""
    if address == "auto":
        return
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        raise SweepError(f"--ray {address}: expected HOST:PORT (the address `ray start --head` prints, port 6379 "
                         "by default) or auto (the cluster started on this machine)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise SweepError(f"cannot reach the Ray cluster at {address}: {error.strerror or error} (is `ray start "
                         f"--head` running there, and the port open?)") from None


def code_modules() -> list[Any]:
    """The project's packages, shipped to a cluster's workers so they run the driver's code."""
    import runtime
    import server

    return [runtime, server]


def start_ray(ray: Any, address: str | None, workers: int | None) -> bool:
    """Start or join Ray; True when this call did (and so must shut it down)."""
    if ray.is_initialized():
        return False
    env_vars = dict(WORKER_ENV)
    if "OPENBLAS_CORETYPE" in os.environ:  # (pins OpenBLAS's kernels: the same bits on different CPUs)
        env_vars["OPENBLAS_CORETYPE"] = os.environ["OPENBLAS_CORETYPE"]
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR, "include_dashboard": False}
    try:
        if address in (None, "local"):
            ray.init(address="local", num_cpus=workers, runtime_env={"env_vars": env_vars}, **quiet)
        else:
            check_reachable(address)
            quiet.pop("include_dashboard")  # (a setting of a new instance, not of a driver joining one)
            ray.init(address=address, runtime_env={"env_vars": env_vars, "py_modules": code_modules()}, **quiet)
    except SweepError:
        raise
    except Exception as error:
        if address in (None, "local"):
            raise SweepError(f"cannot start a local Ray instance: {first_line(error)}") from None
        hint = "" if address == "auto" else (" (a cluster with token authentication, the default of `ray start` "
                                             "since Ray 2.59, needs RAY_AUTH_MODE=token and its token, in "
                                             "~/.ray/auth_token or RAY_AUTH_TOKEN, here too)")
        raise SweepError(f"cannot join the Ray cluster at {address}: {first_line(error)}{hint}") from None
    return True


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def run_on_ray(jobs: Sequence[SessionJob], packages: Sequence[Package], *, address: str | None, workers: int | None,
               report: Report, on_result: Callable[[JobResult], None]) -> None:
    """Run ``jobs`` (job i on ``packages[i]``) as Ray tasks; ``on_result`` gets each result as it arrives (errors
    included: the caller raises); at most ``workers`` in flight when given. Ray is shut down afterwards when this
    call started or joined it."""
    ray = import_ray()
    started_here = start_ray(ray, address, workers)
    pending: dict[Any, SessionJob] = {}
    try:
        sink = ray.remote(num_cpus=0)(RoundSink).remote()
        task = ray.remote(num_cpus=1, max_retries=0)(ray_job)
        shipped: dict[int, Any] = {}  # id(package) -> its files in the object store, once per package
        queue = list(zip(jobs, packages, strict=True))
        limit = workers or len(queue)
        while queue or pending:
            while queue and len(pending) < limit:
                job, package = queue.pop(0)
                if id(package) not in shipped:
                    shipped[id(package)] = ray.put(PackageFiles.of(package))
                pending[task.remote(job, shipped[id(package)], sink)] = job
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
            for item in ray.get(sink.drain.remote()):
                report(*item)
            for ref in ready:
                job = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as error:  # a worker that died, a task Ray could not run
                    raise SweepError(f"session {job.config.name!r} failed on Ray: {type(error).__name__}: "
                                     f"{first_line(error)}", label=job.config.name) from None
                on_result(result)
    except ray.exceptions.RayError as error:  # (Ray itself: a cluster that went away, an actor that never ran)
        raise SweepError(f"Ray failed: {type(error).__name__}: {first_line(error)}") from None
    finally:
        for ref in pending:  # (a failure elsewhere: stop the rest rather than wait for them; not forced, so that
            ray.cancel(ref)  # a task interrupted removes its temporary folder)
        if started_here:
            deadline = time.monotonic() + 10
            while pending and time.monotonic() < deadline:  # let cancelled tasks end before the shutdown
                _, still = ray.wait(list(pending), num_returns=len(pending), timeout=0.5)
                pending = {ref: pending[ref] for ref in still}
            ray.shutdown()
