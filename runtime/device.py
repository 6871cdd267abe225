"""Where a peer trains: `cpu` (numpy), `webgpu`, or `auto` (time a few steps of the actual model on both).

The hybrid update: the task plays or prepares its data on the CPU and the training step (forward, backward,
optimizer) runs on the active backend; `train_on_device` makes the chosen backend active around one unit.
Where `navigator.gpu` or an adapter is missing the peer says so and uses the CPU. The choice and both
timings go to the page (`window.peertrain.device`, the "Device" field) as a `device` message.

What `auto` times is the task's own probe (`Task.device_probe`, see `runtime.device_probe`); this module knows
no task. GPU steps read back once: the language-model probe (`runtime.train_step.lm_step_async`) does forward,
backward, clipping on the device (`runtime.optim.clip_grad_norm(..., on_device=True)`) and Adam, then awaits
one read of the loss. Task code that reads mid-step (`clip_grad_norm` on the host) still works on WebGPU when
entered through `runPythonAsync` or `callPromising`, because blocking reads then go through JSPI
(`pyodide.ffi.run_sync`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from runtime.backend import Backend, get_backend, set_backend
from runtime.backend.numpy_backend import NumpyBackend
from runtime.device_probe import Probe

DEVICES = ("cpu", "webgpu", "auto")


@dataclass
class DeviceChoice:
    chosen: str  # "cpu" or "webgpu"
    requested: str
    cpu_ms: float | None = None  # median time of one step of the probe, where measured
    webgpu_ms: float | None = None
    reason: str = ""

    def describe(self) -> str:
        name = "WebGPU" if self.chosen == "webgpu" else "CPU (numpy in Pyodide)"
        if self.cpu_ms is not None and self.webgpu_ms is not None:
            return f"{name}, chosen by auto: CPU {self.cpu_ms:.1f} ms, WebGPU {self.webgpu_ms:.1f} ms per step"
        return f"{name} ({self.reason})" if self.reason else name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"description": self.describe()}


async def time_steps(backend: Backend, probe: Probe, steps: int = 3) -> float:
    """Median milliseconds per step of `probe` on `backend`, after one warm-up step (pipeline compilation)."""
    previous = set_backend(backend)
    try:
        step = probe()
        await step()
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            await step()
            times.append((time.perf_counter() - started) * 1000)
    finally:
        set_backend(previous)
    return float(np.median(times))


_chosen: list[Backend] = []


async def choose_device(mode: str, probe: Probe | None = None, *, steps: int = 3, navigator: Any = None,
                        report: bool = True) -> tuple[DeviceChoice, Backend]:
    """Pick the backend for `mode`; `auto` times `steps` steps of `probe` on both and keeps the faster."""
    if mode not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {mode!r}")
    cpu: Backend = NumpyBackend()
    choice, backend = DeviceChoice("cpu", mode, reason="requested"), cpu
    if mode != "cpu":
        from runtime.backend.webgpu import create_backend
        from runtime.backend.webgpu_context import WebGPUUnavailable

        try:
            gpu = await create_backend(navigator=navigator)
        except WebGPUUnavailable as error:
            choice = DeviceChoice("cpu", mode, reason=f"no WebGPU: {error}")
        else:
            if mode == "webgpu" or probe is None:
                choice, backend = DeviceChoice("webgpu", mode, reason="requested"), gpu
            else:
                cpu_ms, gpu_ms = await time_steps(cpu, probe, steps), await time_steps(gpu, probe, steps)
                faster = "webgpu" if gpu_ms < cpu_ms else "cpu"
                choice = DeviceChoice(faster, mode, cpu_ms, gpu_ms, reason="faster of the two")
                backend = gpu if faster == "webgpu" else cpu
    _chosen[:] = [backend]
    if report:
        from runtime.backend.webgpu import post_to_page

        post_to_page({"type": "device", **choice.to_dict()})
    return choice, backend


async def choose_for_peer(peer: Any, mode: str, steps: int = 2) -> str:
    """The worker's entry point: choose the device for this peer's task, timing the task's own probe
    (`Task.device_probe`); returns the choice as JSON."""
    choice, _ = await choose_device(mode, peer.task.device_probe(), steps=steps)
    return json.dumps(choice.to_dict())


def train_on_device(peer: Any, assignment: str, unit_message: object = None) -> bytes:
    """`peer.train` with the chosen backend active (call it through `callPromising` so reads can block)."""
    previous = set_backend(_chosen[0] if _chosen else get_backend())
    try:
        return bytes(peer.train(assignment, unit_message))
    finally:
        set_backend(previous)
