"""Where a peer trains: `cpu` (numpy), `webgpu`, or `auto` (time a few steps of the actual model on both).

The hybrid update: the task plays or prepares its data on the CPU and the training step (forward, backward,
optimizer) runs on the active backend; `train_on_device` makes the chosen backend active around one unit.
Where `navigator.gpu` or an adapter is missing the peer says so and uses the CPU. The choice and both
timings go to the page (`window.peertrain.device`, the "Device" field) as a `device` message.

GPU steps read back once: `transformer_step` does forward, backward, clipping (`clip_gradients_on_device`,
no host round trip) and Adam, then awaits one read of the loss. Task code that reads mid-step (CartPole's
clip mask, `runtime.optim.clip_grad_norm`) still works on WebGPU when entered through `runPythonAsync` or
`callPromising`, because blocking reads then go through JSPI (`pyodide.ffi.run_sync`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from runtime.backend import Backend, get_backend, set_backend
from runtime.backend.numpy_backend import NumpyBackend

DEVICES = ("cpu", "webgpu", "auto")
Step = Callable[[], Awaitable[float]]  # one training step on the active backend; returns the loss
Probe = Callable[[], Step]  # builds model, optimizer and data on the active backend; returns its step


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


async def read_back(backend: Any, *arrays: Any) -> list[np.ndarray]:
    """The step's one read-back: one awaited buffer mapping on WebGPU, plain arrays on numpy."""
    read = getattr(backend, "read", None)
    if read is not None:
        return list(await read(*arrays))
    return [np.asarray(backend.to_numpy(x)) for x in arrays]


def clip_gradients_on_device(params: list[Any], max_norm: float) -> Any:
    """Scale the gradients by min(1, max_norm / (norm + 1e-6)) without reading the norm back (it stays a
    0-d backend array, returned); the same maths as `runtime.optim.clip_grad_norm`."""
    backend = get_backend()
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return backend.zeros((), np.float32)
    total = backend.squared_norm(grads[0].grad)
    for param in grads[1:]:
        total = backend.binary("add", total, backend.squared_norm(param.grad))
    norm = backend.unary("sqrt", total)
    ratio = backend.binary("div", backend.full((), max_norm, norm.dtype), backend.binary("add", norm, 1e-6))
    scale = backend.where(backend.compare("lt", ratio, 1.0), ratio, 1.0)
    for param in grads:
        param.grad = backend.binary("mul", param.grad, scale)
    return norm


async def transformer_step(model: Any, optimizer: Any, tokens: np.ndarray, clip: float = 1.0) -> float:
    """One language-model step on (B, T + 1) tokens with a single read-back at the end."""
    _, loss = model(tokens[:, :-1], tokens[:, 1:])
    optimizer.zero_grad()
    loss.backward()
    if clip > 0:
        clip_gradients_on_device(model.parameters(), clip)
    optimizer.step()
    (value,) = await read_back(get_backend(), loss.data)
    return float(value)


def probe_for_model(model: Any, *, batch_size: int = 8, rows: int = 1024, seed: int = 0) -> Probe:
    """A probe running the model's own kind of update: the policy-gradient step of CartPole for an MLP
    policy (on a synthetic batch of `rows` steps), an Adam language-model step for a transformer."""
    state = model.state_dict()
    config = model.config
    kind = type(model)
    rng = np.random.default_rng(seed)

    def build() -> Any:
        copy = kind(config, seed)
        copy.load_state_dict(state)  # same weights on every backend
        return copy

    if kind.__name__ == "MLPPolicy":
        from runtime.optim import Adam
        from runtime.tasks.cartpole import PolicyBatch, update_policy

        width = config.sizes[0]
        batch = PolicyBatch(rng.normal(size=(rows, width)).astype(np.float32), rng.integers(0, 2, size=rows),
                            rng.normal(size=rows).astype(np.float32), np.full(rows, np.log(0.5), np.float32))

        def policy_probe() -> Step:
            policy = build()
            optimizer = Adam(policy.parameters(), lr=0.01)

            async def step() -> float:
                return update_policy(policy, optimizer, batch, clip_ratio=0.2)

            return step

        return policy_probe

    from runtime.optim import Adam

    tokens = rng.integers(0, config.vocab_size, size=(batch_size, config.context + 1))

    def transformer_probe() -> Step:
        transformer = build()
        optimizer = Adam(transformer.parameters(), lr=1e-3)
        return lambda: transformer_step(transformer, optimizer, tokens)

    return transformer_probe


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
    """The worker's entry point: choose the device for this peer's task; returns the choice as JSON."""
    settings = getattr(peer.task, "settings", None)
    probe = probe_for_model(peer.task.build_model(0), batch_size=int(getattr(settings, "batch_size", 8) or 8))
    choice, _ = await choose_device(mode, probe, steps=steps)
    return json.dumps(choice.to_dict())


def train_on_device(peer: Any, assignment: str, unit_message: object = None) -> bytes:
    """`peer.train` with the chosen backend active (call it through `callPromising` so reads can block)."""
    previous = set_backend(_chosen[0] if _chosen else get_backend())
    try:
        return bytes(peer.train(assignment, unit_message))
    finally:
        set_backend(previous)
