"""``peertrain bench webgpu``: time per update on the CPU and on WebGPU inside the page's worker.

Two models, each through the device chooser (`runtime.device.choose_device("auto", ...)`), so the timings
are the ones `auto` compares and the table says what it picked: the 114-weight CartPole policy (one
policy-gradient update on a batch of ``--rows`` steps, Adam) and ``bytelm-2.3mb`` (forward + backward +
clipping + Adam on ``--batch`` x 64 tokens, one read-back per step). Headless Chromium runs WebGPU on
SwiftShader (a software rasteriser on the CPU), so the GPU path is expected to lose here; the anchor is
the CPU (numpy in Pyodide) in the same worker, and the ratio is WebGPU time / CPU time.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

MEASURE = """
import json
from runtime.backend.webgpu import create_backend
from runtime.device import choose_device
from runtime.tasks.bytetext import ByteTextTask
from runtime.tasks.cartpole import CartPoleTask

gpu = await create_backend()
rows = []
models = [("CartPole policy 4-16-2", CartPoleTask({{"model": "4-16-2"}}), {{"rows": {rows}}}, "{rows} steps")]
if {bytelm}:
    models.append(("bytelm-2.3mb", ByteTextTask({{"model": "bytelm-2.3mb"}}), {{"batch_size": {batch}}},
                   "{batch} x 64 tokens"))
for name, task, options, batch in models:
    model = task.build_model(0)
    before = (gpu.context.dispatches, gpu.context.reads)
    choice, _ = await choose_device("auto", task.device_probe(**options), steps={steps}, report=False)
    dispatches, reads = gpu.context.dispatches - before[0], gpu.context.reads - before[1]
    rows.append({{"model": name, "weights": model.num_parameters(), "batch": batch, "cpu_ms": choice.cpu_ms,
                  "webgpu_ms": choice.webgpu_ms, "auto": choice.chosen,
                  "dispatches_per_update": dispatches / ({steps} + 1), "reads_per_update": reads / ({steps} + 1)}})
json.dumps({{"rows": rows, "adapter": gpu.context.adapter_info}})
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=3, help="timed updates per device (after one warm-up)")
    parser.add_argument("--rows", type=int, default=1024, help="CartPole batch: environment steps per update")
    parser.add_argument("--batch", type=int, default=4, help="bytelm-2.3mb batch (sequences of 64 tokens)")
    parser.add_argument("--skip-bytelm", action="store_true", help="only the CartPole policy")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from server.browser.launcher import relay_process, run_in_worker, worker_page
    from server.harness.serve_command import ServeCommand

    code = MEASURE.format(rows=args.rows, batch=args.batch, steps=args.steps, bytelm=not args.skip_bytelm)
    with relay_process(ServeCommand(no_session=True)) as url, worker_page(url) as page:
        return json.loads(run_in_worker(page, code, timeout_s=3600))


def table(result: dict[str, Any]) -> str:
    lines = [f"WebGPU adapter: {result['adapter'] or 'unknown'}",
             "| model | weights | batch | CPU ms/update | WebGPU ms/update | WebGPU / CPU | auto chose "
             "| GPU dispatches / update | read-backs / update |",
             "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for row in result["rows"]:
        lines.append(f"| {row['model']} | {row['weights']:,} | {row['batch']} | {row['cpu_ms']:.1f} "
                     f"| {row['webgpu_ms']:.1f} | {row['webgpu_ms'] / row['cpu_ms']:.1f}x | {row['auto']} "
                     f"| {row['dispatches_per_update']:.0f} | {row['reads_per_update']:.0f} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    print(f"measuring in the page's worker: {args.steps} timed updates per device after one warm-up", flush=True)
    result = measure(args)
    print(table(result))
    return 0
