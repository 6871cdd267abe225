"""The WebGPU device context: pipelines, buffers, command batching and the read-back point.

Only this module and `runtime.backend.webgpu` touch the browser (`js`, `pyodide`), and only inside functions.

How work reaches the GPU. Every kernel call becomes one dispatch in a compute pass that stays open until
something needs the results on the host. Each dispatch's parameters (64 u32 words, floats as bit patterns)
go into a slot of a shared parameter arena, written with one `queue.writeBuffer` just before the batch is
submitted. Buffers come from a pool keyed by byte size: a buffer whose last array was dropped returns to
the pool only after the batch that may still use it has been submitted (queue order makes reuse safe).

Reading back. `mapAsync` returns a Promise. `read_async(*arrays)` copies every array into one staging
buffer, submits, awaits the mapping once and slices the result: a training step that does forward,
backward and the optimizer with no reads and then `await backend.read(loss, ...)` maps once per step.
`read_sync` does the same but blocks on the Promise with `pyodide.ffi.run_sync` (JSPI), which works where
the Python call was entered through `runPythonAsync` or `callPromising` (Pyodide 0.27.7, Chromium >= 137).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

WGSL_DIR = Path(__file__).resolve().parent / "wgsl"
MAP_READ, COPY_SRC, COPY_DST, STORAGE = 0x01, 0x04, 0x08, 0x80
COMPUTE_STAGE = 0x4
PARAM_WORDS = 64  # 256 bytes per dispatch: minStorageBufferOffsetAlignment
ARENA_SLOTS = 2048
MAX_GROUPS = 65535

# kernel -> binding kinds after binding 0 (the parameters): "w" read_write storage, "r" read-only storage.
KERNELS: dict[str, str] = {
    "elementwise": "wrrr",
    "reduce": "wr",
    "matmul": "wrr",
    "matmul_direct": "wrr",
    "softmax": "wr",
    "softmax_backward": "wrr",
    "layer_norm": "wwwrrr",
    "layer_norm_backward": "wrrrr",
    "cross_entropy": "wwrr",
    "cross_entropy_backward": "wrrr",
    "gather": "wrr",
    "segment_sum": "wrrr",
    "sgd": "wwr",
    "adam": "wwwr",
}


class WebGPUUnavailable(RuntimeError):
    """No WebGPU here: not in a browser, `navigator.gpu` missing, or no adapter/device."""


def _js_object(value: Any) -> Any:
    from js import Object
    from pyodide.ffi import to_js

    return to_js(value, dict_converter=Object.fromEntries)


def f32_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


class Buffer:
    """One GPUBuffer of `size` bytes; goes back to the context's pool when the last array using it is dropped."""

    __slots__ = ("gpu", "size", "context", "version", "__weakref__")

    def __init__(self, context: GPUContext, gpu: Any, size: int) -> None:
        self.context, self.gpu, self.size = context, gpu, size
        self.version = 0  # bumped by in-place kernels, so cached host copies know they are stale

    def __del__(self) -> None:
        context = self.context
        if context is not None and not context.closed:
            context.pending_free.append((self.size, self.gpu))


class GPUContext:
    """A GPUDevice plus everything needed to run kernels on it from Python."""

    def __init__(self, device: Any, adapter_info: str = "") -> None:
        self.device = device
        self.queue = device.queue
        self.adapter_info = adapter_info
        self.closed = False
        self.pipelines: dict[str, tuple[Any, Any]] = {}
        self.pool: dict[int, list[Any]] = {}
        self.pending_free: list[tuple[int, Any]] = []
        self.staging: dict[int, list[Any]] = {}
        self.arena_host = np.zeros(ARENA_SLOTS * PARAM_WORDS, dtype=np.uint32)
        self.arena = device.createBuffer(_js_object({"size": self.arena_host.nbytes, "usage": STORAGE | COPY_DST}))
        self.arena_used = 0
        self.encoder: Any = None
        self.compute_pass: Any = None
        self.dispatches = 0  # counters for benchmarks
        self.submits = 0
        self.reads = 0
        self.dummy = self.buffer(16)  # bound where a kernel's optional input or output is absent

    # pipelines
    def pipeline(self, kernel: str) -> tuple[Any, Any]:
        if kernel not in self.pipelines:
            source = (WGSL_DIR / "common.wgsl").read_text() + "\n" + (WGSL_DIR / f"{kernel}.wgsl").read_text()
            module = self.device.createShaderModule(_js_object({"code": source, "label": kernel}))
            kinds = "r" + KERNELS[kernel]
            entries = [{"binding": i, "visibility": COMPUTE_STAGE,
                        "buffer": {"type": "storage" if kind == "w" else "read-only-storage"}}
                       for i, kind in enumerate(kinds)]
            layout = self.device.createBindGroupLayout(_js_object({"entries": entries}))
            pipeline_layout = self.device.createPipelineLayout(_js_object({"bindGroupLayouts": [layout]}))
            pipeline = self.device.createComputePipeline(_js_object({
                "layout": pipeline_layout, "compute": {"module": module, "entryPoint": "main"}, "label": kernel,
            }))
            self.pipelines[kernel] = (pipeline, layout)
        return self.pipelines[kernel]

    # buffers
    def buffer(self, nbytes: int) -> Buffer:
        size = max(16, -(-nbytes // 16) * 16)
        free = self.pool.get(size)
        gpu = free.pop() if free else self.device.createBuffer(
            _js_object({"size": size, "usage": STORAGE | COPY_SRC | COPY_DST}))
        return Buffer(self, gpu, size)

    def upload(self, data: np.ndarray) -> Buffer:
        """A new buffer holding `data` (float32 or uint32), written through the queue."""
        from pyodide.ffi import to_js

        data = np.ascontiguousarray(data)
        buffer = self.buffer(data.nbytes)
        if data.nbytes:
            self.queue.writeBuffer(buffer.gpu, 0, to_js(memoryview(data.reshape(-1)).cast("B")))
        return buffer

    # batching
    def dispatch(self, kernel: str, params: list[int], buffers: list[Buffer], groups: tuple[int, int, int]) -> None:
        if self.arena_used == ARENA_SLOTS:
            self.flush()
        pipeline, layout = self.pipeline(kernel)
        slot = self.arena_used
        self.arena_used += 1
        self.arena_host[slot * PARAM_WORDS: slot * PARAM_WORDS + len(params)] = params
        entries = [{"binding": 0, "resource": {"buffer": self.arena, "offset": slot * PARAM_WORDS * 4,
                                               "size": PARAM_WORDS * 4}}]
        entries += [{"binding": i + 1, "resource": {"buffer": b.gpu}} for i, b in enumerate(buffers)]
        bind_group = self.device.createBindGroup(_js_object({"layout": layout, "entries": entries}))
        if self.compute_pass is None:
            if self.encoder is None:
                self.encoder = self.device.createCommandEncoder()
            self.compute_pass = self.encoder.beginComputePass()
        self.compute_pass.setPipeline(pipeline)
        self.compute_pass.setBindGroup(0, bind_group)
        self.compute_pass.dispatchWorkgroups(*groups)
        self.dispatches += 1

    def dispatch_linear(self, kernel: str, params: list[int], buffers: list[Buffer], count: int,
                        per_group: int = 256) -> None:
        """A dispatch of ceil(count / per_group) workgroups laid out in 2-D (see `group_index` in WGSL)."""
        groups = max(1, -(-count // per_group))
        width = min(groups, MAX_GROUPS)
        self.dispatch(kernel, params, buffers, (width, -(-groups // width), 1))

    def _encoder(self) -> Any:
        if self.compute_pass is not None:
            self.compute_pass.end()
            self.compute_pass = None
        if self.encoder is None:
            self.encoder = self.device.createCommandEncoder()
        return self.encoder

    def flush(self) -> None:
        """Submit what is encoded; buffers dropped meanwhile become reusable afterwards."""
        from pyodide.ffi import to_js

        if self.encoder is not None or self.compute_pass is not None:
            encoder = self._encoder()
            if self.arena_used:
                used = self.arena_host[: self.arena_used * PARAM_WORDS]
                self.queue.writeBuffer(self.arena, 0, to_js(memoryview(used).cast("B")))
            self.queue.submit(_js_object([encoder.finish()]))
            self.submits += 1
            self.encoder = None
            self.arena_used = 0
        for size, gpu in self.pending_free:
            self.pool.setdefault(size, []).append(gpu)
        self.pending_free.clear()

    # reading back (the one point where the host waits for the GPU)
    def _stage(self, pieces: list[tuple[Buffer, int, int]]) -> tuple[Any, list[tuple[int, int]]]:
        """Copy (buffer, byte offset, byte length) pieces into one staging buffer and submit."""
        spans, total = [], 0
        for _, _, length in pieces:
            spans.append((total, length))
            total += -(-length // 4) * 4
        size = max(16, -(-total // 16) * 16)
        free = self.staging.get(size)
        staging = free.pop() if free else self.device.createBuffer(
            _js_object({"size": size, "usage": MAP_READ | COPY_DST}))
        encoder = self._encoder()
        for (buffer, offset, length), (start, _) in zip(pieces, spans, strict=True):
            if length:
                encoder.copyBufferToBuffer(buffer.gpu, offset, staging, start, -(-length // 4) * 4)
        self.flush()
        self.reads += 1
        return staging, spans

    def _unstage(self, staging: Any, spans: list[tuple[int, int]]) -> list[bytes]:
        data = staging.getMappedRange().to_bytes()
        staging.unmap()
        self.staging.setdefault(int(staging.size), []).append(staging)
        return [data[start: start + length] for start, length in spans]

    def read_sync(self, pieces: list[tuple[Buffer, int, int]]) -> list[bytes]:
        from pyodide.ffi import can_run_sync, run_sync

        if not can_run_sync():
            raise RuntimeError("reading a WebGPU array synchronously needs JSPI (code entered through "
                               "runPythonAsync or callPromising); use `await backend.read(...)` instead")
        staging, spans = self._stage(pieces)
        run_sync(staging.mapAsync(MAP_READ))
        return self._unstage(staging, spans)

    async def read_async(self, pieces: list[tuple[Buffer, int, int]]) -> list[bytes]:
        staging, spans = self._stage(pieces)
        await staging.mapAsync(MAP_READ)
        return self._unstage(staging, spans)

    def close(self) -> None:
        self.flush()
        self.closed = True
        for buffers in (*self.pool.values(), *self.staging.values()):
            for gpu in buffers:
                gpu.destroy()
        self.pool.clear()
        self.staging.clear()


def webgpu_entry(navigator: Any = None) -> Any:
    """`navigator.gpu`, or WebGPUUnavailable saying why there is none."""
    try:
        import js
    except ImportError as error:
        raise WebGPUUnavailable("not in a browser (no `js` module)") from error
    navigator = navigator if navigator is not None else getattr(js, "navigator", None)
    gpu = getattr(navigator, "gpu", None) if navigator is not None else None
    if gpu is None or type(gpu).__name__ == "JsNull":
        raise WebGPUUnavailable("navigator.gpu is missing: this browser or context has no WebGPU")
    return gpu


async def request_context(*, navigator: Any = None) -> GPUContext:
    """Ask the browser for an adapter and a device; raises WebGPUUnavailable with the reason."""
    adapter = await webgpu_entry(navigator).requestAdapter()
    if adapter is None:
        raise WebGPUUnavailable("navigator.gpu.requestAdapter() returned no adapter")
    limits = adapter.limits
    wanted = {"maxStorageBufferBindingSize": int(limits.maxStorageBufferBindingSize),
              "maxBufferSize": int(limits.maxBufferSize)}
    device = await adapter.requestDevice(_js_object({"requiredLimits": wanted}))
    if device is None:
        raise WebGPUUnavailable("adapter.requestDevice() returned no device")
    info = getattr(adapter, "info", None)
    description = "/".join(str(getattr(info, key, "") or "") for key in ("vendor", "architecture")) if info else ""
    return GPUContext(device, description)
