"""``peertrain bench workers``: units per minute of one page with 1..W training workers, against one worker.

Per worker count a fresh relay (``peertrain serve`` in its own process; bytetext by default, asynchronous merging so a
worker never waits for a round's last unit; validation only every 1,000 merges, so the relay, on the same cores as
the page here, takes little of their time) and one headless Chromium page at ``?join=1&workers=W``. Once every
worker has uploaded a unit (boot, first weights and JIT warm-up behind it), the bench counts the next ``--units``
uploads of the page and their time: units per minute, against the one-worker run of the same bench (the anchor).
Beside it: each worker's memory (its Pyodide's WebAssembly heap, nearly all of it: numpy, the runtime, the model and
its optimizer) and the page's longest main-thread task while they train (a PerformanceObserver of long tasks, 50 ms
and more; 0 when there was none).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from server.browser.peers import join_url
from server.cli.options import parse_sets
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.options import RelayOptions
from server.session.config import SessionConfig

PROBE = """() => ({
  state: document.body.dataset.state,
  error: document.getElementById('error').textContent,
  units: window.peertrain.unitsDone,
  workers: window.peertrain.workers.map((w) => ({ units: w.unitsDone, heap: w.heapBytes, state: w.state })),
  longest: window.peertrain.longestTaskMs,
})"""


@dataclass
class WorkersRun:
    workers: int
    units: int
    seconds: float
    heap_bytes: list[int]
    longest_task_ms: float
    boot_seconds: float

    @property
    def per_minute(self) -> float:
        return 60.0 * self.units / self.seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="bytetext", help="the session's task (default bytetext)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="a task setting for the session (repeatable)")
    parser.add_argument("--max-workers", type=int, default=2, help="measure 1 .. this many workers (default 2)")
    parser.add_argument("--units", type=int, default=12,
                        help="uploads counted per run, after each worker's first (default 12)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take (default 900)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")


def run(args: argparse.Namespace) -> int:
    if args.max_workers < 1 or args.units < 1:
        print("peertrain bench workers: --max-workers and --units must be at least 1")
        return 2
    runs: list[WorkersRun] = []
    with tempfile.TemporaryDirectory(prefix="peertrain-workers-") as folder:
        for workers in range(1, args.max_workers + 1):
            measured = measure(Path(folder), args, workers)
            runs.append(measured)
            print(f"{workers} worker{'s' if workers > 1 else ''}: {measured.units} units in {measured.seconds:.1f} s "
                  f"({measured.per_minute:.2f} per minute)", flush=True)
    figures = print_table(args.task, runs)
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2))
    return 0


def measure(folder: Path, args: argparse.Namespace, workers: int) -> WorkersRun:
    from playwright.sync_api import sync_playwright

    from server.browser.chromium import launch_options

    serve = ServeCommand(task=args.task, task_settings=parse_sets(args.settings), fresh=True,
                         session_dir=folder / f"session-{workers}",
                         config=SessionConfig(participants=3, mode="async", validate_every=1000, passes=100),
                         options=RelayOptions(admin_token="", verify=False))  # (replays would share the cores measured)
    relay = RelayProcess(serve, log=folder / f"relay-{workers}.log")
    relay.start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(**launch_options())
            try:
                page = browser.new_context().new_page()
                opened = time.monotonic()
                page.goto(join_url(relay.page_url, workers))
                deadline = opened + args.timeout
                seen = wait(page, lambda s: len(s["workers"]) == workers and all(w["units"] >= 1 for w in s["workers"]),
                            deadline, f"{workers} workers to upload a unit each")
                boot = time.monotonic() - opened
                page.evaluate("() => { window.peertrain.longestTaskMs = 0; }")
                start_units, started = seen["units"], time.monotonic()
                seen = wait(page, lambda s: s["units"] >= start_units + args.units, deadline,
                            f"{args.units} more units")
                seconds = time.monotonic() - started
                return WorkersRun(workers, seen["units"] - start_units, seconds,
                                  [int(w["heap"] or 0) for w in seen["workers"]], float(seen["longest"]), boot)
            finally:
                browser.close()
    finally:
        relay.stop()


def wait(page: Any, done: Any, deadline: float, what: str) -> dict[str, Any]:
    """Poll the page until ``done(probe)``; fails with the page's state past ``deadline``."""
    while True:
        seen: dict[str, Any] = page.evaluate(PROBE)
        if seen["state"] == "failed":
            raise RuntimeError(f"the page failed: {seen['error']}")
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}; the page: {seen}")
        page.wait_for_timeout(250)


def print_table(task: str, runs: list[WorkersRun]) -> dict[str, Any]:
    anchor = runs[0]
    print(f"\n{task}: one page, its units per minute with W training workers against one worker")
    print("| workers | units | seconds | units / minute | vs 1 worker | heap per worker (MB) "
          "| longest main-thread task |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for each in runs:
        heaps = ", ".join(f"{heap / 2**20:.0f}" for heap in each.heap_bytes)
        print(f"| {each.workers} | {each.units} | {each.seconds:.1f} | {each.per_minute:.2f} | "
              f"{each.per_minute / anchor.per_minute:.2f}x | {heaps} | {each.longest_task_ms:.0f} ms |")
    return {"task": task, "runs": [asdict(each) | {"per_minute": each.per_minute} for each in runs]}
