"""``peertrain bench runtime``: training throughput of bytelm-2.3mb in CPython, PyTorch and Pyodide.

Forward + backward + Adam on batches of 16 x 64 tokens, measured in one run on this machine:
this runtime in CPython (its own process, so its peak memory is its own); PyTorch CPU on the same
model (the Python 3.11 environment ``.venv-torch``, 2 threads); this runtime in Pyodide inside the
page's worker in headless Chromium, once with its default matmul (the WebAssembly SIMD kernel) and once
with numpy's own loop (``?blas=numpy``). Targets: CPython >= 0.5x PyTorch, Pyodide >= 1/10 of CPython,
peak memory of the CPython step < 300 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from server.paths import REPO_ROOT

TORCH_PYTHON = Path(os.environ.get("PEERTRAIN_TORCH_PYTHON", REPO_ROOT / ".venv-torch" / "bin" / "python"))
TORCH_ORACLE = REPO_ROOT / "tests" / "runtime" / "torch_oracle.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="bytelm-2.3mb", help="transformer preset")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per engine")
    parser.add_argument("--browser-steps", type=int, default=3, help="timed steps in Pyodide (slower)")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--skip-browser", action="store_true")


def measure_code(config: str, steps: int, warmup: int) -> str:
    return ("import json\nfrom runtime.bench_step import train_steps_throughput\n"
            f"json.dumps(train_steps_throughput({config!r}, steps={steps}, warmup={warmup}))")


def measure_cpython(config: str, steps: int) -> dict[str, Any]:
    code = measure_code(config, steps, 2).replace("json.dumps(", "print(json.dumps(") + ")"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO_ROOT)
    return json.loads(out.stdout)


def measure_torch(config: str, steps: int) -> dict[str, Any] | str:
    if not TORCH_PYTHON.exists():
        return f"no PyTorch environment at {TORCH_PYTHON} (make torch-env)"
    from runtime.models.transformer import preset

    command = [str(TORCH_PYTHON), str(TORCH_ORACLE), "--bench", "--config", preset(config).to_json(),
               "--steps", str(steps), "--threads", "2"]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
    if out.returncode != 0:
        return f"torch failed: {out.stderr.strip()[-300:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_pyodide(config: str, steps: int, *, query: str = "") -> dict[str, Any] | str:
    """In the page's worker, the page opened with ``query`` (e.g. ``?blas=numpy``); notes the page's matmul."""
    from server.browser.launcher import relay_process, run_in_worker, worker_page
    from server.harness.serve_command import ServeCommand

    with relay_process(ServeCommand(no_session=True)) as url, worker_page(url + query) as page:
        row = json.loads(run_in_worker(page, measure_code(config, steps, 1)))
        row["matmul"] = page.evaluate("window.peertrain.versions.matmul")  # type: ignore[attr-defined]
        return row


def run(args: argparse.Namespace) -> int:
    rows: dict[str, dict[str, Any] | str] = {}
    print(f"measuring {args.config}: forward + backward + Adam, batch 16 x 64 tokens", flush=True)
    rows["runtime, CPython"] = measure_cpython(args.config, args.steps)
    print("  CPython done", flush=True)
    rows["PyTorch CPU (2 threads)"] = "skipped" if args.skip_torch else measure_torch(args.config, args.steps)
    print("  PyTorch done", flush=True)
    rows["runtime, Pyodide (Chromium worker)"] = ("skipped" if args.skip_browser
                                                   else measure_pyodide(args.config, args.browser_steps))
    rows["runtime, Pyodide, numpy matmul (?blas=numpy)"] = (
        "skipped" if args.skip_browser else measure_pyodide(args.config, args.browser_steps, query="?blas=numpy"))
    print()
    print(f"{'engine':46} {'tokens/s':>10} {'s/step':>8} {'peak MB':>8}")
    for name, row in rows.items():
        if isinstance(row, str):
            print(f"{name:46} {row}")
        else:
            peak = row.get("peak_rss_mb")
            print(f"{name:46} {row['tokens_per_second']:10.0f} {row['seconds_per_step']:8.3f} "
                  f"{(f'{peak:.0f}' if peak else '-'):>8}")
    cpython, torch, pyodide, pyodide_numpy = rows.values()
    if isinstance(pyodide, dict):
        print(f"\nPyodide's matmul by default: {pyodide['matmul']}")
    if isinstance(cpython, dict):
        peak = cpython.get("peak_rss_mb") or 0
        print(f"\nCPython peak memory {peak:.0f} MB (target < 300 MB): {'ok' if peak < 300 else 'MISSED'}")
        if isinstance(torch, dict):
            ratio = cpython["tokens_per_second"] / torch["tokens_per_second"]
            print(f"CPython / PyTorch = {ratio:.2f}x (target >= 0.5x): {'ok' if ratio >= 0.5 else 'MISSED'}")
        for label, row in (("Pyodide", pyodide), ("Pyodide, numpy matmul", pyodide_numpy)):
            if isinstance(row, dict):
                ratio = row["tokens_per_second"] / cpython["tokens_per_second"]
                print(f"{label} / CPython = {ratio:.3f}x (target >= 0.1x): {'ok' if ratio >= 0.1 else 'MISSED'}")
    return 0
