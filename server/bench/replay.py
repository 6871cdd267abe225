"""``peertrain bench replay``: how far a browser's result is from the host's replay of the same unit.

The relay verifies a result by training its unit again (``server.relay.verify``): on the browser's own engine
(``--engine pyodide``, the default: Pyodide under Node, ``server.browser_assets.engines``), where a CPU unit must come
out bit for bit, or natively (``--engine native``), accepted when ``|result - replay| <= rtol * |replay - global| +
atol``. Per built-in task this bench serves a package from ``peertrain serve`` (replays off: nothing is banned while
measuring), opens the page in headless Chromium (``?test=1``) and, in the page's worker (``runtime.worker``, the
module the page trains with), joins, fetches weights and units, trains and uploads honestly, many units per call.
The worker hands back each result message and each round's weights; a host thread replays every unit while the
browser trains the next batch and records ``relative = |browser - replay| / |replay - global|`` and ``absolute``
(L2, float64: ``server.relay.verify.deviation``), and whether the two are identical bit for bit. Devices: ``cpu``
(numpy in Pyodide with the WebAssembly SIMD matmul) and ``webgpu`` (SwiftShader in headless Chromium, so few
units; a WebGPU unit against the CPU replay keeps a tolerance). The recommended ``rtol`` is ``--margin`` times the
largest relative deviation, rounded up to 1, 2 or 5 x 10^n. For CartPole the worker also plays the unit's episodes
again and sends a digest of every action, compared with a native replay's: a forked episode is counted apart.
With ``--work-dir`` each round's weights message stays in ``weights-<task>/``, to replay a unit again.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import shutil
import statistics
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime import wire
from runtime.peer import Peer
from runtime.protocol import Job
from server.bench.replay_worker import WORKER_BATCH, WORKER_DEVICE, WORKER_SETUP, actions_digest
from server.browser_assets.engines import PyodideEngine
from server.harness.serve_command import ServeCommand
from server.relay.options import RelayOptions
from server.relay.verify import DEFAULT_VERIFY_ATOL, DEFAULT_VERIFY_RTOL, deviation, matches
from server.session.config import SessionConfig

DEVICES = ("cpu", "webgpu")
MARGIN = 10.0
BATCH_SECONDS = 20.0  # the worker returns after about this long (at least one unit): one progress line each
BATCH_TIMEOUT_SECONDS = 900.0  # one batch call into the worker (a WebGPU unit on SwiftShader can take minutes)
HOLD_SECONDS = 15.0
MAX_WAITS = 200  # held work requests per unit before the worker gives up (a round that never opens)


@dataclass(frozen=True)
class TaskSetup:
    """A built-in task as this bench runs it: its settings, units per round, and the WebGPU unit count."""

    settings: dict[str, Any]
    k: int
    cpu_units: int
    webgpu_units: int
    note: str = ""


TASKS: dict[str, TaskSetup] = {
    # 50 chunks of 200 problems (3 epochs of 7 batches of 32: 21 Adam steps per unit); the default 8 chunks
    # (120 steps, ~20 s a unit in the browser) would not fit 100 units in the time budget.
    "arith": TaskSetup({"tokenizer": "char", "epochs": 3, "chunks": 50}, k=10, cpu_units=100,
                       webgpu_units=4,
                       note="chunks=50: 21 local steps per unit"),
    "bytetext": TaskSetup({}, k=11, cpu_units=100, webgpu_units=1, note="bytelm-2.3mb, 8 local steps per unit"),
    # more units: the policy reaches the 500-step limit after ~15 rounds, where honest updates start to scatter
    "cartpole": TaskSetup({"units": 10, "episodes_per_unit": 8}, k=10, cpu_units=300, webgpu_units=30,
                          note="8 episodes, 6 PPO epochs per unit"),
}
QUICK_TASK = "arith"
QUICK_UNITS = 3

# ---------------------------------------------------------------- the deviation maths


@dataclass
class UnitDeviation:
    """One unit trained in the browser and replayed natively."""

    task: str
    device: str
    round: int
    slot: int
    unit_index: int
    unit_seed: int
    relative: float  # |browser - native| / |native - global|
    absolute: float  # |browser - native|
    update_norm: float  # |native - global|
    identical: bool  # bit for bit the same weights
    accepted: bool  # what the relay's default tolerance would say
    examples_browser: int
    examples_native: int
    metrics_browser: dict[str, float]
    metrics_native: dict[str, float]
    browser_seconds: float
    native_seconds: float
    actions_match: bool | None = None  # an experience unit's episodes: every action the same (None: no episodes)

    @property
    def trajectory_differs(self) -> bool:
        """The episodes forked (an action, an episode length or a return differs); never for data tasks."""
        returns = [name for name in ("mean_return", "max_return") if name in self.metrics_native]
        return self.actions_match is False or self.examples_browser != self.examples_native or any(
            self.metrics_browser.get(name) != self.metrics_native[name] for name in returns)


def compare(browser: np.ndarray, native: np.ndarray, global_weights: np.ndarray, *, rtol: float = DEFAULT_VERIFY_RTOL,
            atol: float = DEFAULT_VERIFY_ATOL) -> tuple[float, float, float, bool]:
    """(relative, absolute, update norm, accepted) of a browser result against the native replay.

    The norms are ``server.relay.verify.deviation``'s and ``accepted`` is ``verify.matches`` at the given
    tolerance, so the figures are exactly what the relay computes. A zero update with a zero deviation has
    relative deviation 0; any deviation from a zero update is infinitely relative."""
    absolute, scale = deviation(browser, native, global_weights)
    accepted, relative = matches(browser, native, global_weights, rtol=rtol, atol=atol)
    return relative, absolute, scale, accepted


def summarize(rows: list[UnitDeviation]) -> dict[str, Any]:
    """Units, median / p99 / max relative deviation, max absolute, identical and forked counts."""
    relative = np.array([r.relative for r in rows], dtype=np.float64)
    absolute = np.array([r.absolute for r in rows], dtype=np.float64)
    forked = [r for r in rows if r.trajectory_differs]
    return {"units": len(rows),
            "median_relative": float(np.median(relative)) if rows else math.nan,
            "p99_relative": float(np.percentile(relative, 99)) if rows else math.nan,
            "max_relative": float(relative.max()) if rows else math.nan,
            "max_absolute": float(absolute.max()) if rows else math.nan,
            "identical": sum(r.identical for r in rows),
            "refused_at_default": sum(not r.accepted for r in rows),
            "trajectories_differ": len(forked),
            "max_relative_forked": max((r.relative for r in forked), default=None),
            "max_relative_unforked": max((r.relative for r in rows if not r.trajectory_differs), default=None),
            "rounds": len({r.round for r in rows}),
            "browser_seconds_per_unit": statistics.fmean(r.browser_seconds for r in rows) if rows else math.nan,
            "native_seconds_per_unit": statistics.fmean(r.native_seconds for r in rows) if rows else math.nan}


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 x 10^n at or above ``value`` (> 0)."""
    exponent = math.floor(math.log10(value))
    for mantissa in (1, 2, 5, 10):
        candidate = mantissa * 10.0**exponent
        if candidate >= value * (1 - 1e-12):
            return float(f"{candidate:.3g}")
    raise AssertionError(value)


def recommend(largest: float, margin: float = MARGIN) -> float:
    """``margin`` x the largest relative deviation seen, rounded up to 1, 2 or 5 x 10^n (a floor of 1e-6)."""
    return nice_ceiling(max(largest * margin, 1e-6))


# ---------------------------------------------------------------- the native side


class Replayer:
    """Replays the browser's units in one worker thread, on the browser's engine (one Pyodide worker) or natively
    with one ``Peer`` (the relay's verifier does either)."""

    def __init__(self, task: str, device: str, task_json: str, chunk: Any, weights: dict[int, bytes],
                 engine: str = "pyodide") -> None:
        self.task, self.device, self.task_json, self.chunk = task, device, task_json, chunk
        self.weights = weights  # round -> the weights message the browser trained from (shared by a task's runs)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-replay")
        self._peer: Peer | None = None
        self.engine = PyodideEngine() if engine == "pyodide" else None
        self.futures: list[Future[UnitDeviation]] = []

    def submit(self, batch: dict[str, Any]) -> None:
        self.weights.update({int(r): base64.b64decode(m) for r, m in batch["weights"].items()})
        for unit in batch["units"]:
            self.futures.append(self._pool.submit(self._replay, unit))

    def _replay(self, unit: dict[str, Any]) -> UnitDeviation:
        job = Job.from_json(unit["job"])
        if self._peer is None:
            self._peer = Peer(self.task_json)
        peer = self._peer
        if peer.weights_round != job.round:
            peer.set_weights(self.weights[job.round])
        assert peer.weights is not None
        chunk = None
        if job.kind == "data":
            chunk = self.chunk(job.unit_index)
            if hashlib.sha256(chunk).hexdigest() != unit["unit_sha256"]:
                raise RuntimeError(f"unit {job.unit_index}: the package's chunk is not what the browser got")
        started = time.perf_counter()
        message = self.engine.train(json.loads(self.task_json), job, self.weights[job.round], chunk) \
            if self.engine is not None else peer.train(job, chunk)
        native_header, native = wire.decode(message)
        native_seconds = time.perf_counter() - started
        browser_header, browser = wire.decode(base64.b64decode(unit["result"]))
        relative, absolute, scale, accepted = compare(browser, native, peer.weights)
        actions_match = None
        if unit.get("actions_sha256") is not None:
            played = peer.task.play(peer.weights, job.unit_seed, job.episodes)  # type: ignore[attr-defined]
            actions_match = actions_digest(played) == unit["actions_sha256"]
        return UnitDeviation(
            task=self.task, device=self.device, round=job.round, slot=job.slot,
            unit_index=job.unit_index, unit_seed=job.unit_seed, relative=relative,
            absolute=absolute, update_norm=scale,
            identical=bool(np.array_equal(browser, native)), accepted=accepted,
            examples_browser=browser_header.num_examples, examples_native=native_header.num_examples,
            metrics_browser=_metrics(browser_header), metrics_native=_metrics(native_header),
            browser_seconds=float(unit["seconds"]), native_seconds=native_seconds, actions_match=actions_match)

    def done(self) -> list[UnitDeviation]:
        return [f.result() for f in self.futures if f.done()]

    def wait(self) -> list[UnitDeviation]:
        rows = [f.result() for f in self.futures]
        self._pool.shutdown(wait=True)
        if self.engine is not None:
            self.engine.close()
        return rows


def _metrics(header: wire.WireHeader) -> dict[str, float]:
    return {k: float(v) for k, v in (header.metrics or {}).items() if k != "seconds"}


# ---------------------------------------------------------------- the browser side

def serve_command(package: Path, session_dir: Path, setup: TaskSetup, units: int, num_units: int) -> ServeCommand:
    passes = -(-(units + 2 * setup.k) // num_units) + 1  # more rounds than the bench trains: none ends the session
    options = RelayOptions(admin_token="bench-replay", min_peers=1, lease_seconds=3600.0, peer_timeout=3600.0,
                           join_rate=0.0, max_peers_per_address=0,
                           outlier_factor=0.0,  # one peer uploads every slot: never refuse an honest result
                           verify=False)  # measuring the tolerance, not applying it
    # codec none: browser and native float32 weights compared, not updates
    return ServeCommand(package=package, session_dir=session_dir, fresh=True, options=options,
                        config=SessionConfig(participants=setup.k, passes=passes, codec="none"))


@dataclass
class Run:
    """One (task, device): the units measured and the wall time."""

    task: str
    device: str
    requested: int
    rows: list[UnitDeviation] = field(default_factory=list)
    seconds: float = 0.0
    chosen: str = ""
    skipped: str = ""

    def summary(self) -> dict[str, Any]:
        return {"task": self.task, "device": self.device, "requested": self.requested, "chosen": self.chosen,
                "skipped": self.skipped, "seconds": self.seconds} | summarize(self.rows)


def train_in_browser(page: Any, run: Run, replayer: Replayer) -> None:
    """Batches of units in the page's worker until ``run.requested`` units are trained, each batch replayed."""
    from server.browser.launcher import run_in_worker

    started = time.perf_counter()
    trained = 0
    while trained < run.requested:
        code = WORKER_BATCH.format(units=run.requested - trained, seconds=BATCH_SECONDS, hold=HOLD_SECONDS,
                                   max_waits=MAX_WAITS)
        batch = json.loads(run_in_worker(page, code, timeout_s=BATCH_TIMEOUT_SECONDS))
        replayer.submit(batch)
        trained += len(batch["units"])
        rows = replayer.done()
        worst = f"{max(r.relative for r in rows):.3g}" if rows else "-"
        last_round = batch["units"][-1]["job"]["round"] if batch["units"] else "-"
        print(f"  {run.task} {run.device}: {trained}/{run.requested} units trained (round {last_round}), "
              f"{len(rows)} replayed, max relative so far {worst}, {time.perf_counter() - started:.0f} s",
              flush=True)
        if batch["done"] or not batch["units"]:
            print(f"  {run.task} {run.device}: the session ran out of units at {trained}", flush=True)
            break


def measure_task(task: str, setup: TaskSetup, units: dict[str, int], work: Path, engine: str) -> list[Run]:
    """Every requested device of one task: one relay, one page, the devices one after another."""
    from server.browser.launcher import relay_process, run_in_worker, worker_page
    from server.session.package import build_package

    package = build_package(task, setup.settings, work / f"package-{task}", check=False, log=lambda _: None)
    runs = [Run(task, device, count) for device, count in units.items() if count > 0]
    serve = serve_command(package.path, work / f"session-{task}", setup, sum(r.requested for r in runs),
                          package.data.num_units)
    with relay_process(serve, log_path=work / f"serve-{task}.log") as url, worker_page(url) as page:
        task_json = run_in_worker(page, WORKER_SETUP)
        weights: dict[int, bytes] = {}  # the worker sends a round's weights once, whichever device asked first
        for run in runs:
            started = time.perf_counter()
            choice = json.loads(run_in_worker(page, WORKER_DEVICE.format(device=run.device), timeout_s=300))
            run.chosen = choice["chosen"]
            if run.chosen != run.device:
                run.skipped = f"{run.device} unavailable: {choice.get('description') or choice}"
                print(f"  {task} {run.device}: skipped ({run.skipped})", flush=True)
                continue
            replayer = Replayer(task, run.device, task_json, package.chunk_bytes, weights, engine)
            try:
                train_in_browser(page, run, replayer)
            except Exception as error:  # a failed device (a crashed page, a timeout): report it, keep the rest
                run.skipped = f"failed after {len(replayer.futures)} units: {type(error).__name__}: {error}"[:500]
                print(f"  {task} {run.device}: {run.skipped}", flush=True)
                run.rows, run.seconds = replayer.wait(), time.perf_counter() - started
                break  # the page may still be busy with the failed call: no further device on it
            run.rows, run.seconds = replayer.wait(), time.perf_counter() - started
    (work / f"weights-{task}").mkdir(exist_ok=True)  # each round's global weights, to replay a unit again
    for round_index, message in weights.items():
        (work / f"weights-{task}" / f"{round_index:05d}.ptw").write_bytes(message)
    return runs


# ---------------------------------------------------------------- the report


def table(summaries: list[dict[str, Any]]) -> str:
    lines = ["| task | device | units | rounds | median relative | p99 relative | max relative | max absolute | "
             "bit-identical | trajectories differ | refused at rtol 1e-2 | browser s/unit | replay s/unit | time (s) |",
             "| --- | --- |" + " ---: |" * 12]
    for s in summaries:
        if not s["units"]:
            lines.append(f"| {s['task']} | {s['device']} | 0 | - | - | - | - | - | - | - | - | - | - | "
                         f"{s['seconds']:.0f} |")
            continue
        lines.append(f"| {s['task']} | {s['device']} | {s['units']} | {s['rounds']} | {s['median_relative']:.2e} | "
                     f"{s['p99_relative']:.2e} | {s['max_relative']:.2e} | {s['max_absolute']:.2e} | "
                     f"{s['identical']} | {s['trajectories_differ']} | {s['refused_at_default']} | "
                     f"{s['browser_seconds_per_unit']:.2f} | {s['native_seconds_per_unit']:.2f} | "
                     f"{s['seconds']:.0f} |")
    return "\n".join(lines)


def recommendation(summaries: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    measured = [s for s in summaries if s["units"]]
    if not measured:
        return {"largest_relative": None, "recommended_rtol": None, "margin": margin}
    worst = max(measured, key=lambda s: s["max_relative"])
    largest = float(worst["max_relative"])
    rtol = recommend(largest, margin)
    return {"largest_relative": largest, "largest_at": f"{worst['task']} {worst['device']}", "margin": margin,
            "recommended_rtol": rtol, "current_default_rtol": DEFAULT_VERIFY_RTOL,
            "current_default_headroom": DEFAULT_VERIFY_RTOL / largest if largest > 0 else math.inf}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--units", type=int, default=None, help="units per task on the CPU (default per task: " +
                        ", ".join(f"{t} {s.cpu_units}" for t, s in TASKS.items()) + ")")
    parser.add_argument("--webgpu-units", type=int, default=None,
                        help="units per task on WebGPU (default per task: " +
                        ", ".join(f"{t} {s.webgpu_units}" for t, s in TASKS.items()) + ")")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma list of built-in tasks")
    parser.add_argument("--devices", default=",".join(DEVICES), help="comma list: cpu, webgpu")
    parser.add_argument("--engine", choices=("pyodide", "native"), default="pyodide",
                        help="replay on the browser's engine (Pyodide under Node) or natively")
    parser.add_argument("--margin", type=float, default=MARGIN, help="recommended rtol = margin x largest relative")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_UNITS} units of {QUICK_TASK} on the CPU only")
    parser.add_argument("--work-dir", type=Path, help="packages and sessions (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/replay.json"), help="figures as JSON")


def plan(args: argparse.Namespace) -> dict[str, dict[str, int]]:
    """Per task, units per device."""
    if args.quick:
        return {QUICK_TASK: {"cpu": QUICK_UNITS}}
    tasks = [t.strip() for t in str(args.tasks).split(",") if t.strip()]
    devices = [d.strip() for d in str(args.devices).split(",") if d.strip()]
    for name in tasks:
        if name not in TASKS:
            raise SystemExit(f"peertrain bench replay: unknown task {name!r}; choose from {', '.join(TASKS)}")
    for device in devices:
        if device not in DEVICES:
            raise SystemExit(f"peertrain bench replay: unknown device {device!r}; choose from {', '.join(DEVICES)}")
    def units(name: str, device: str) -> int:
        chosen = args.units if device == "cpu" else args.webgpu_units
        return int(chosen if chosen is not None else getattr(TASKS[name], f"{device}_units"))

    return {name: {device: units(name, device) for device in devices} for name in tasks}


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="peertrain-bench-replay-"))
    work.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    try:
        for task, units in plan(args).items():
            setup = TASKS[task]
            print(f"{task} ({json.dumps(setup.settings)}; {setup.note}): " +
                  ", ".join(f"{n} units on {d}" for d, n in units.items()), flush=True)
            runs += measure_task(task, setup, units, work, args.engine)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - started
    summaries = [r.summary() for r in runs]
    advice = recommendation(summaries, args.margin)
    markdown = table(summaries)
    print()
    print(markdown)
    print()
    for s in summaries:
        if s["skipped"]:
            print(f"{s['task']} {s['device']}: {s['skipped']}")
    if advice["recommended_rtol"] is not None:
        print(f"largest relative deviation: {advice['largest_relative']:.3g} ({advice['largest_at']}); "
              f"recommended default rtol = {args.margin:g}x that, rounded up: {advice['recommended_rtol']:g} "
              f"(current default {DEFAULT_VERIFY_RTOL:g}: {advice['current_default_headroom']:.3g}x the largest)")
    for s in summaries:
        if s["trajectories_differ"]:
            print(f"{s['task']} {s['device']}: episode lengths or returns differ in {s['trajectories_differ']} of "
                  f"{s['units']} units (max relative among them {s['max_relative_forked']:.3g}, among the others "
                  f"{s['max_relative_unforked'] if s['max_relative_unforked'] is not None else '-'})")
    print(f"total time {total:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "tasks": {t: asdict(TASKS[t]) for t in {r.task for r in runs}}, "summaries": summaries,
        "recommendation": advice, "seconds": total, "table": markdown,
        "units": [asdict(row) | {"trajectory_differs": row.trajectory_differs} for r in runs for row in r.rows]},
        indent=1))
    print(f"figures: {args.out}")
    return 0
