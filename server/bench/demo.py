"""``peertrain bench demo``: the README's demo as a newcomer runs it, ``make demo PEERS=3``, timed and its model
asked, beside the same session in the simulator (the anchor, in the same run).

The session is the Makefile's ``DEMO_SESSION``, read from the Makefile at run time so the two cannot drift
(``--demo-args``: more options after it, as the Makefile's ``DEMO_ARGS``, given to both runs):
- **the anchor**: ``peertrain simulate DEMO_SESSION`` in a child process; its seconds are the ones it prints for
  its sessions (the package's build left out);
- **the browsers**: ``peertrain serve --port 0 DEMO_SESSION --peers N --fresh`` in a fresh temporary session folder
  (``server.harness.relay_process``: the one way benches start a relay), ``N`` headless Chromium pages started by
  serve; timed on the session's event stream (``GET /api/events``) from the first unit handed out to ``done``
  (Chromium's start and the package's build left out).

Each model's figures: the task's validation as the session's last history entry holds it (exact answers on the
200 validation problems, the held-out pairs, the three-digit problems beyond the range), and the final weights
asked all 100 one-digit sums ``a+b`` (a, b in 0..9, every one of them trained on). ``--record FILE`` writes them
as JSON with the date, the machine and the commit; ``summary_sentence`` is the sentence README.md and BENCHMARKS.md
quote from docs/benchmarks/demo.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from server.paths import REPO_ROOT

MAKEFILE = REPO_ROOT / "Makefile"
SIMULATED = re.compile(r"^(\d+) session\(s\) in ([0-9.]+) s\b", re.MULTILINE)  # simulate's last line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=3, help="headless Chromium peers serve starts (default 3)")
    parser.add_argument("--demo-args", default="", metavar="ARGS",
                        help="more session options after DEMO_SESSION, as the Makefile's DEMO_ARGS (both runs)")
    parser.add_argument("--record", type=Path, metavar="FILE",
                        help="write the figures, date, machine and commit as JSON (default: none written)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the browsers' session may take")
    parser.add_argument("--work-dir", type=Path, help="the two sessions' folders (default: a temporary folder)")


def demo_session(makefile: Path = MAKEFILE) -> list[str]:
    """The Makefile's ``DEMO_SESSION ?= ...``: the settings ``make demo`` serves, as arguments."""
    for line in makefile.read_text().splitlines():
        name, equals, value = line.partition("=")
        if equals and name.rstrip(" ?:") == "DEMO_SESSION":
            return shlex.split(value)
    raise ValueError(f"{makefile} sets no DEMO_SESSION")


def simulated_seconds(output: str) -> float:
    """The seconds ``peertrain simulate`` prints for its sessions (``1 session(s) in 17.7 s in-process; ...``)."""
    found = SIMULATED.findall(output)
    if not found:
        raise ValueError(f"peertrain simulate printed no 'N session(s) in S s' line:\n{output[-2000:]}")
    return float(found[-1][1])


# -- the figures of one model -------------------------------------------------------------------------------------
def one_digit_sums(task: Any, weights: np.ndarray) -> list[str]:
    """The model's answers to every ``a+b`` with a, b in 0..9, as ``a+b=answer`` (a, then b, ascending)."""
    from runtime.data.arith import make_problem
    from runtime.tasks.arith import encode_prompts

    sums = [make_problem(a, "+", b) for a in range(10) for b in range(10)]
    answers = task.answers(task.load(weights), encode_prompts(task.tokenizer, sums, "sums"), "sums")
    return [f"{problem.prompt}{answer}" for problem, answer in zip(sums, answers, strict=True)]


def wrong_sums(answered: list[str]) -> list[str]:
    """Those of ``one_digit_sums``'s answers that are wrong."""
    wrong = []
    for text in answered:
        sum_text, _, answer = text.partition("=")
        a, _, b = sum_text.partition("+")
        if answer != str(int(a) + int(b)):
            wrong.append(text)
    return wrong


def figures(metrics: dict[str, float], validation: dict[str, np.ndarray], answered: list[str],
            seconds: float, rounds: int) -> dict[str, Any]:
    """One model's figures: the last history entry's ``metrics``, turned into counts over the package's
    ``validation`` sets, and its one-digit sums ``answered``."""
    beyond = validation["gen_beyond"].astype(bool)
    heldout_size, beyond_size = int((~beyond).sum()), int(beyond.sum())
    wrong = wrong_sums(answered)
    return {
        "seconds": round(seconds, 1), "rounds": rounds, "val_loss": metrics["val_loss"],
        "accuracy": metrics["accuracy"], "correct": int(metrics["correct"]),
        "validation_size": len(validation["val_answers"]),
        "heldout_correct": round(metrics["heldout_accuracy"] * heldout_size), "heldout_size": heldout_size,
        "beyond_range_correct": round(metrics["beyond_range_accuracy"] * beyond_size), "beyond_range_size": beyond_size,
        "one_digit_correct": len(answered) - len(wrong), "one_digit_size": len(answered), "one_digit_wrong": wrong,
    }


def session_figures(session_dir: Path, package_dir: Path, seconds: float) -> dict[str, Any]:
    """The figures of the session in ``session_dir`` (its history and latest weights) on the package it ran."""
    from runtime.tasks.arith import ArithTask
    from server.session import checkpoint_files
    from server.session.package import Package

    package = Package.load(package_dir)
    if not isinstance(package.task, ArithTask):
        raise ValueError(f"the demo's task is {package.task.name}; this bench asks arith's questions")
    history = [json.loads(line) for line in (session_dir / checkpoint_files.HISTORY_FILE).read_text().splitlines()]
    weights = checkpoint_files.read_latest(session_dir).weights
    answered = one_digit_sums(package.task, weights)
    return figures(history[-1]["metrics"], package.data.validation, answered, seconds, len(history))


def describe(figure: dict[str, Any]) -> str:
    return (f"{figure['accuracy'] * 100:.1f} % exact ({figure['correct']}/{figure['validation_size']}), held-out "
            f"{figure['heldout_correct']}/{figure['heldout_size']}, beyond the range "
            f"{figure['beyond_range_correct']}/{figure['beyond_range_size']}, one-digit sums "
            f"{figure['one_digit_correct']}/{figure['one_digit_size']}"
            + (f" (wrong: {', '.join(figure['one_digit_wrong'])})" if 0 < len(figure["one_digit_wrong"]) <= 12 else ""))


# -- the two runs ---------------------------------------------------------------------------------------------------
def run_simulator(session: list[str], out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "server.cli", "simulate", *session, "--no-progress", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"peertrain simulate exited with {done.returncode}:\n{done.stdout[-2000:]}{done.stderr}")
    session_dir = next(out.glob("*/history.jsonl")).parent  # (one merge: fedavg/, unless DEMO_ARGS chose another)
    return session_figures(session_dir, out / "package", simulated_seconds(done.stdout))


def follow(url: str, timeout: float) -> float:
    """Read the session's events until it is done; the seconds from the first unit handed out to ``done``. Prints
    each merged round."""
    deadline = time.monotonic() + timeout
    started: float | None = None
    shown = -1
    with httpx.stream("GET", url + "/api/events", timeout=httpx.Timeout(30.0, read=60.0)) as events:
        for line in events.iter_lines():  # (a keep-alive every 10 s at the least)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the demo's session was not done within {timeout:.0f} s")
            if not line.startswith("data:"):
                continue
            status = json.loads(line.removeprefix("data:"))
            progress = status.get("round_progress") or {}
            if started is None and (progress.get("leased") or progress.get("done") or status["round"] > 0):
                started = time.monotonic()
                print(f"browsers: round 1 of {status['num_rounds']} started", flush=True)
            history = status.get("history") or []
            if history and history[-1]["round"] > shown:
                shown = history[-1]["round"]
                metrics = history[-1].get("metrics") or {}
                print(f"browsers: round {shown + 1} of {status['num_rounds']} merged: "
                      f"{metrics.get('correct', 0):.0f} exact answers, val_loss {metrics.get('val_loss', 0):.4f}",
                      flush=True)
            if status.get("done"):
                if started is None:
                    raise RuntimeError("the session was done before a unit was handed out (not a fresh session?)")
                return time.monotonic() - started
    raise RuntimeError("the relay's event stream ended before the session was done")


def run_browsers(session: list[str], peers: int, work: Path, timeout: float) -> dict[str, Any]:
    from server.harness.relay_process import RelayProcess
    from server.harness.serve_command import ServeCommand

    serve = ServeCommand(session_dir=work / "session", fresh=True, peers=peers, extra=session)
    # Stopped as Ctrl-C stops `make demo` (SIGTERM works too: serve ends its Chromium peers either way).
    with RelayProcess(serve, log=work / "serve.log", start_timeout_s=300.0, stop_signal=signal.SIGINT) as relay:
        print(f"browsers: relay at {relay.url}, {peers} headless Chromium peer(s) joining; log {relay.log}",
              flush=True)
        try:
            seconds = follow(relay.url, timeout)
        except (RuntimeError, TimeoutError, httpx.HTTPError):
            print(relay.logs[-3000:], file=sys.stderr)
            raise
    return session_figures(work / "session", work / "session" / "package", seconds)


# -- the record -----------------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """Cores, the CPU's model (/proc/cpuinfo) and the RAM (/proc/meminfo) of this machine."""
    cpu, ram = "unknown CPU", 0.0
    try:
        cpu = next(line.partition(":")[2].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
        kilobytes = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemTotal:"))
        ram = int(kilobytes) / 2**20
    except (OSError, StopIteration):
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "ram_gib": round(ram, 1)}


def commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "uncommitted_changes": bool(git("status", "--porcelain"))}


def summary_sentence(record: dict[str, Any]) -> str:
    """The one sentence README.md and BENCHMARKS.md quote: the demo's time and figures beside the simulator's."""
    box, browsers, simulator = record["machine"], record["browsers"], record["simulator"]

    def counts(figure: dict[str, Any]) -> str:
        return (f"{figure['accuracy'] * 100:.1f} % exact answers ({figure['correct']}/{figure['validation_size']}), "
                f"{figure['heldout_correct']}/{figure['heldout_size']} on held-out pairs, "
                f"{figure['beyond_range_correct']}/{figure['beyond_range_size']} beyond the range and "
                f"{figure['one_digit_correct']} of {figure['one_digit_size']} one-digit sums")

    return (f"On {record['date']}, on {box['cores']} cores ({box['cpu']}, {box['ram_gib']:g} GiB), "
            f"`{record['command']}` took {browsers['seconds']:.0f} s from the first unit handed out to the end and "
            f"reached {counts(browsers)}; the same session in the simulator took {simulator['seconds']:.0f} s "
            f"(the browsers {record['ratio']:.1f} times as long) and reached {counts(simulator)}.")


def run(args: argparse.Namespace) -> int:
    try:
        session = demo_session() + shlex.split(args.demo_args)
    except (OSError, ValueError) as error:
        print(f"peertrain bench demo: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="peertrain-bench-demo-") as scratch:
        work = Path(args.work_dir or scratch)
        work.mkdir(parents=True, exist_ok=True)
        print(f"the demo's session: {shlex.join(session)}", flush=True)
        print("anchor: the same session in the simulator ...", flush=True)
        simulator = run_simulator(session, work / "simulator")
        print(f"anchor: {simulator['seconds']:.1f} s, {simulator['rounds']} rounds, {describe(simulator)}", flush=True)
        browsers = run_browsers(session, args.peers, work / "browsers", args.timeout)
    ratio = browsers["seconds"] / simulator["seconds"]
    print(f"browsers: {browsers['seconds']:.1f} s from the first unit handed out to done = {ratio:.2f} x the "
          f"simulator's {simulator['seconds']:.1f} s; {browsers['rounds']} rounds, {describe(browsers)}", flush=True)
    now = datetime.datetime.now(datetime.UTC)
    demo = f"make demo PEERS={args.peers}" + (f" DEMO_ARGS={shlex.quote(args.demo_args)}" if args.demo_args else "")
    record = {"bench": "demo", "date": now.date().isoformat(), "time_utc": now.isoformat(timespec="seconds"),
              "machine": machine(), **commit(), "command": demo, "session": shlex.join(session),
              "peers": args.peers, "browsers": browsers, "simulator": simulator, "ratio": round(ratio, 2)}
    print(summary_sentence(record), flush=True)
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"figures written to {args.record}", flush=True)
    return 0
