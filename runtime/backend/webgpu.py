"""The WebGPU backend: every primitive of `runtime.backend` over float32 GPU buffers, WGSL kept in `wgsl/`.

Arrays (`GPUArray`) are strided views of a pooled GPU buffer: reshape of a contiguous array, permute,
broadcast_to and slice_axis make views without touching the GPU; elementwise ops, reductions and matmul read
views through their strides. Booleans and integers live on the GPU as float32 0/1 or small integers (exact
below 2**24) and keep their logical dtype. Integer ids and targets stay host numpy arrays, as on every
backend; index lists derived from them are uploaded as uint32.

Nothing here reads the GPU except `to_numpy` (blocking, through JSPI) and `read` (awaitable); see
`webgpu_context` for how work is batched and read back. Create a backend with `await create_backend()`.
The fused kernels (softmax, cross-entropy, layer norm, attention, optimizers) are in `webgpu_fused`; `GPUArray`
and the kernels' op codes are in `webgpu_array` (both modules import them from there).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from runtime.backend.webgpu_array import (
    BINARY_CODES,
    COMPARE_CODES,
    FLOAT32,
    REDUCE_CODES,
    UNARY_CODES,
    WHERE,
    GPUArray,
)
from runtime.backend.webgpu_context import MAX_GROUPS, Buffer, GPUContext, f32_bits, request_context, webgpu_entry
from runtime.backend.webgpu_fused import FusedKernels

MAX_DIMS = 6


def _logical_dtype(dtype: Any) -> np.dtype:
    dtype = np.dtype(dtype)
    return FLOAT32 if dtype.kind == "f" else dtype


def _resolve_shape(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    shape = tuple(int(n) for n in shape)
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple(size // max(known, 1) if n == -1 else n for n in shape)
    if math.prod(shape) != size:
        raise ValueError(f"cannot reshape an array of size {size} into shape {shape}")
    return shape


def _broadcast_strides(x: GPUArray, shape: tuple[int, ...]) -> tuple[int, ...]:
    """x's strides for a broadcast to `shape` (0 on new and size-1 axes), numpy rules."""
    extra = len(shape) - x.ndim
    if extra < 0:
        raise ValueError(f"cannot broadcast shape {x.shape} to {shape}")
    strides = [0] * extra
    for size, stride, target in zip(x.shape, x.strides, shape[extra:], strict=True):
        if size == target:
            strides.append(stride)
        elif size == 1:
            strides.append(0)
        else:
            raise ValueError(f"cannot broadcast shape {x.shape} to {shape}")
    return tuple(strides)


def _collapse(shape: tuple[int, ...], *stride_sets: tuple[int, ...]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 axes and merge neighbours that are contiguous in every operand (fewer than MAX_DIMS)."""
    dims = [(n, [s[i] for s in stride_sets]) for i, n in enumerate(shape) if n != 1]
    merged: list[tuple[int, list[int]]] = []
    for size, strides in dims:
        if merged and all(prev == cur * size for prev, cur in zip(merged[-1][1], strides, strict=True)):
            merged[-1] = (merged[-1][0] * size, strides)
        else:
            merged.append((size, strides))
    if not merged:
        merged = [(1, [0] * len(stride_sets))]
    if len(merged) > MAX_DIMS:
        raise ValueError(f"a strided view with {len(merged)} independent axes exceeds the {MAX_DIMS} supported")
    return tuple(n for n, _ in merged), [tuple(s[k] for _, s in merged) for k in range(len(stride_sets))]


class WebGPUBackend(FusedKernels):
    """WebGPU implementation of the `runtime.backend.Backend` primitives (float32)."""

    name = "webgpu"

    def __init__(self, context: GPUContext, matmul_kernel: str = "matmul") -> None:
        self.context = context
        self.matmul_kernel = matmul_kernel  # "matmul" (16x16 tiles in workgroup memory) or "matmul_direct"

    # transfer
    def from_numpy(self, array: np.ndarray, dtype: Any = None) -> GPUArray:
        array = np.asarray(array)
        logical = _logical_dtype(dtype if dtype is not None else array.dtype)
        out = GPUArray(self.context.upload(array.astype(np.float32)), array.shape, logical)
        if logical != FLOAT32:  # ids and masks are immutable: keep the host copy
            out.host, out.host_version = np.array(array, dtype=logical), 0
        return out

    def _host_pieces(self, x: GPUArray) -> tuple[GPUArray, tuple[Buffer, int, int]]:
        flat = self.contiguous(x)
        return flat, (flat.buffer, 0, flat.size * 4)

    def _cache(self, x: GPUArray, data: bytes) -> np.ndarray:
        values = np.frombuffer(data, dtype=np.float32).reshape(x.shape).astype(x.dtype)
        x.host, x.host_version = values, x.buffer.version
        return values

    def _cached(self, x: GPUArray) -> np.ndarray | None:
        return x.host if x.host is not None and x.host_version == x.buffer.version else None

    def to_numpy(self, x: GPUArray) -> np.ndarray:
        """The blocking read-back (JSPI); prefer `await read(...)` once per step."""
        cached = self._cached(x)
        if cached is not None:
            return cached.copy()
        _, piece = self._host_pieces(x)
        return self._cache(x, self.context.read_sync([piece])[0]).copy()

    async def read(self, *arrays: GPUArray) -> list[np.ndarray]:
        """Read several arrays back with one buffer mapping (the step's one read-back point)."""
        missing = [x for x in arrays if self._cached(x) is None]
        if missing:
            pieces = [self._host_pieces(x)[1] for x in missing]
            for x, data in zip(missing, await self.context.read_async(pieces), strict=True):
                self._cache(x, data)
        return [np.array(self._cached(x), copy=True) for x in arrays]

    def read_now(self, *arrays: GPUArray) -> list[np.ndarray]:
        """Like `read` but blocking (JSPI): one mapping for all arrays."""
        missing = [x for x in arrays if self._cached(x) is None]
        if missing:
            pieces = [self._host_pieces(x)[1] for x in missing]
            for x, data in zip(missing, self.context.read_sync(pieces), strict=True):
                self._cache(x, data)
        return [np.array(self._cached(x), copy=True) for x in arrays]

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> GPUArray:
        return self.full(shape, 0.0, dtype)

    def full(self, shape: tuple[int, ...], value: float, dtype: Any) -> GPUArray:
        return self._map(UNARY_CODES["copy"], tuple(shape), [float(value)], _logical_dtype(dtype))

    # elementwise
    def _map(self, op: int, shape: tuple[int, ...], operands: list[GPUArray | float], dtype: Any = FLOAT32,
             out: GPUArray | None = None) -> GPUArray:
        """out = f(operands) over `shape`, each operand a broadcastable GPUArray or a Python scalar."""
        if out is None:
            out = GPUArray(self.context.buffer(math.prod(shape) * 4), shape, dtype)
        arrays = [x for x in operands if isinstance(x, GPUArray)]
        stride_sets = [_broadcast_strides(x, shape) for x in arrays] + [out.strides]
        collapsed, strides = _collapse(shape, *stride_sets)
        params = [0] * 51
        params[0], params[1], params[2] = math.prod(shape), op, len(collapsed)
        params[3: 3 + len(collapsed)] = collapsed
        buffers = []
        array_index = 0
        for k in range(3):
            x = operands[k] if k < len(operands) else 0.0
            base = 16 + 8 * k
            if isinstance(x, GPUArray):
                params[base: base + len(collapsed)] = strides[array_index]
                params[base + 6] = x.offset
                array_index += 1
                buffers.append(x.buffer)
            else:
                params[base + 7] = 1
                params[48 + k] = f32_bits(float(x))
                buffers.append(self.context.dummy)
        params[40: 40 + len(collapsed)] = strides[-1]
        params[46] = out.offset
        if params[0]:
            self.context.dispatch_linear("elementwise", params, [out.buffer, *buffers], params[0])
        return out

    def _operand(self, x: Any) -> GPUArray | float:
        if isinstance(x, GPUArray):
            return x
        if isinstance(x, int | float | np.floating | np.integer | np.bool_) or np.ndim(x) == 0:
            return float(x)
        return self.from_numpy(np.asarray(x))

    def _shape_of(self, *operands: GPUArray | float) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(*(x.shape for x in operands if isinstance(x, GPUArray))))

    def unary(self, op: str, x: GPUArray) -> GPUArray:
        return self._map(UNARY_CODES[op], x.shape, [x])

    def binary(self, op: str, x: GPUArray, y: GPUArray | float) -> GPUArray:
        a, b = self._operand(x), self._operand(y)
        return self._map(BINARY_CODES[op], self._shape_of(a, b), [a, b])

    def compare(self, op: str, x: GPUArray, y: GPUArray | float) -> GPUArray:
        a, b = self._operand(x), self._operand(y)
        return self._map(COMPARE_CODES[op], self._shape_of(a, b), [a, b], np.dtype(bool))

    def where(self, condition: GPUArray, x: GPUArray | float, y: GPUArray | float) -> GPUArray:
        c, a, b = self._operand(condition), self._operand(x), self._operand(y)
        return self._map(WHERE, self._shape_of(c, a, b), [c, a, b])

    def contiguous(self, x: GPUArray) -> GPUArray:
        return x if x.is_contiguous() else self._map(UNARY_CODES["copy"], x.shape, [x], x.dtype)

    # linear algebra and reductions
    def matmul(self, a: GPUArray, b: GPUArray, transpose_a: bool = False, transpose_b: bool = False) -> GPUArray:
        if transpose_a:
            a = self._swap_last(a)
        if transpose_b:
            b = self._swap_last(b)
        (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
        if k != k2:
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align")
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        a_batch = _broadcast_strides(GPUArray(a.buffer, a.shape[:-2], strides=a.strides[:-2]), batch)
        b_batch = _broadcast_strides(GPUArray(b.buffer, b.shape[:-2], strides=b.strides[:-2]), batch)
        batch_shape, (a_batch, b_batch) = _collapse(batch, a_batch, b_batch) if batch else ((1,), [(0,), (0,)])
        if len(batch_shape) > 4:
            raise ValueError(f"matmul supports up to 4 independent batch axes, got {batch}")
        count = math.prod(batch)
        out = GPUArray(self.context.buffer(count * m * n * 4), batch + (m, n))
        params = [0] * 22
        params[0:4] = [m, n, k, len(batch_shape)]
        params[4: 4 + len(batch_shape)] = batch_shape
        params[8: 8 + len(batch_shape)] = a_batch
        params[12: 12 + len(batch_shape)] = b_batch
        params[16:22] = [a.offset, a.strides[-2], a.strides[-1], b.offset, b.strides[-2], b.strides[-1]]
        if count > MAX_GROUPS:
            raise ValueError(f"matmul batch of {count} exceeds {MAX_GROUPS}")
        if count * m * n:  # k == 0 gives zeros: the tile loop does not run
            groups = (-(-n // 16), -(-m // 16), count)
            self.context.dispatch(self.matmul_kernel, params, [out.buffer, a.buffer, b.buffer], groups)
        return out

    def _swap_last(self, x: GPUArray) -> GPUArray:
        axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
        return self.permute(x, axes)

    def reduce(self, op: str, x: GPUArray, axes: Any, keepdims: bool) -> GPUArray:
        if op not in ("sum", "max", "sumsq"):
            raise ValueError(f"unknown reduction {op!r}")
        axes = tuple(range(x.ndim)) if axes is None else tuple(sorted(a % x.ndim for a in axes))
        kept = [i for i in range(x.ndim) if i not in axes]
        kept_shape = tuple(x.shape[i] for i in kept)
        out_shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims else kept_shape
        outputs, count = math.prod(kept_shape), math.prod(x.shape[i] for i in axes)
        out = GPUArray(self.context.buffer(outputs * 4), out_shape)
        kept_dims, (kept_strides,) = _collapse(kept_shape, tuple(x.strides[i] for i in kept))
        red_dims, (red_strides,) = _collapse(tuple(x.shape[i] for i in axes), tuple(x.strides[i] for i in axes))
        params = [0] * 30
        params[0:5] = [outputs, count, REDUCE_CODES[op], x.offset, len(kept_dims)]
        params[5: 5 + len(kept_dims)] = kept_dims
        params[11: 11 + len(kept_dims)] = kept_strides
        params[17] = len(red_dims)
        params[18: 18 + len(red_dims)] = red_dims
        params[24: 24 + len(red_dims)] = red_strides
        if outputs:
            self.context.dispatch_linear("reduce", params, [out.buffer, x.buffer], outputs, per_group=1)
        return out

    # layout (views where possible)
    def reshape(self, x: GPUArray, shape: tuple[int, ...]) -> GPUArray:
        shape = _resolve_shape(tuple(shape), x.size)
        if not x.is_contiguous():
            x = self.contiguous(x)
        return GPUArray(x.buffer, shape, x.dtype, None, x.offset)

    def permute(self, x: GPUArray, axes: tuple[int, ...]) -> GPUArray:
        axes = tuple(a % x.ndim for a in axes)
        return GPUArray(x.buffer, tuple(x.shape[a] for a in axes), x.dtype, tuple(x.strides[a] for a in axes),
                        x.offset)

    def broadcast_to(self, x: GPUArray, shape: tuple[int, ...]) -> GPUArray:
        shape = tuple(shape)
        return GPUArray(x.buffer, shape, x.dtype, _broadcast_strides(x, shape), x.offset)

    def slice_axis(self, x: GPUArray, axis: int, start: int, stop: int) -> GPUArray:
        axis %= x.ndim
        start, stop, _ = slice(start, stop).indices(x.shape[axis])
        shape = x.shape[:axis] + (max(0, stop - start),) + x.shape[axis + 1:]
        return GPUArray(x.buffer, shape, x.dtype, x.strides, x.offset + start * x.strides[axis])

    def concatenate(self, arrays: list[GPUArray], axis: int) -> GPUArray:
        axis %= arrays[0].ndim
        total = sum(x.shape[axis] for x in arrays)
        shape = arrays[0].shape[:axis] + (total,) + arrays[0].shape[axis + 1:]
        out = GPUArray(self.context.buffer(math.prod(shape) * 4), shape, arrays[0].dtype)
        start = 0
        for x in arrays:
            view = self.slice_axis(out, axis, start, start + x.shape[axis])
            self._map(UNARY_CODES["copy"], view.shape, [x], out.dtype, out=view)
            start += x.shape[axis]
        return out

    def _flat_positions(self, shape: tuple[int, ...], key: Any) -> np.ndarray:
        key = tuple(self.to_numpy(k) if isinstance(k, GPUArray) else k for k in key) if isinstance(key, tuple) \
            else (self.to_numpy(key) if isinstance(key, GPUArray) else key)
        return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)[key]

    def index(self, x: GPUArray, key: Any) -> GPUArray:
        positions = self._flat_positions(x.shape, key)
        return self._gather(self.contiguous(x), positions.reshape(-1), 1, positions.shape, x.dtype)

    def index_add(self, shape: tuple[int, ...], key: Any, values: GPUArray) -> GPUArray:
        positions = self._flat_positions(tuple(shape), key)
        values = self.contiguous(self.broadcast_to(values, positions.shape))
        return self._segment_sum(positions.reshape(-1), values, math.prod(shape), 1, tuple(shape))

    # embeddings and masks
    def take_rows(self, table: GPUArray, ids: Any) -> GPUArray:
        ids = np.asarray(ids)
        width = table.shape[-1]
        return self._gather(self.contiguous(table), ids.reshape(-1), width, ids.shape + (width,), FLOAT32)

    def scatter_add_rows(self, ids: Any, grad_rows: GPUArray, num_rows: int) -> GPUArray:
        width = grad_rows.shape[-1]
        return self._segment_sum(np.asarray(ids).reshape(-1), self.contiguous(grad_rows), num_rows, width,
                                 (num_rows, width))

    def _gather(self, source: GPUArray, index: np.ndarray, width: int, shape: tuple[int, ...], dtype: Any) -> Any:
        out = GPUArray(self.context.buffer(math.prod(shape) * 4), shape, dtype)
        if out.size:
            index_buffer = self.context.upload(np.asarray(index, dtype=np.uint32))
            self.context.dispatch_linear("gather", [out.size, width], [out.buffer, source.buffer, index_buffer],
                                         out.size)
        return out

    def _segment_sum(self, destinations: np.ndarray, source: GPUArray, rows: int, width: int,
                     shape: tuple[int, ...]) -> GPUArray:
        """out[r] = sum of source rows i with destinations[i] == r, in a fixed (stable sorted) order."""
        destinations = np.asarray(destinations, dtype=np.int64)
        order = np.argsort(destinations, kind="stable").astype(np.uint32)
        starts = np.searchsorted(destinations[order], np.arange(rows + 1)).astype(np.uint32)
        out = GPUArray(self.context.buffer(rows * width * 4), shape)
        if order.size == 0:
            return self.zeros(shape, FLOAT32)
        start_buffer, order_buffer = self.context.upload(starts), self.context.upload(order)
        self.context.dispatch_linear("segment_sum", [rows * width, width],
                                     [out.buffer, source.buffer, start_buffer, order_buffer], rows * width)
        return out

    def dropout_mask(self, shape: tuple[int, ...], p: float, rng: np.random.Generator, dtype: Any) -> GPUArray:
        # Drawn on the host like the numpy backend, so a seed drops the same units on either backend.
        mask = (rng.random(shape, dtype=np.float32) >= p).astype(np.float32)
        mask *= 1.0 / (1.0 - p)
        return self.from_numpy(mask)


_shared: list[WebGPUBackend] = []


async def create_backend(*, navigator: Any = None, reuse: bool = True) -> WebGPUBackend:
    """The page worker's WebGPU backend (one GPUDevice, kept for reuse); raises WebGPUUnavailable."""
    webgpu_entry(navigator)  # checked every time: a context may lose (or a test may hide) navigator.gpu
    if reuse and _shared:
        return _shared[0]
    context = await request_context(navigator=navigator)
    # On SwiftShader (software) workgroup barriers cost more than the tiles save: about 2x, measured.
    software = "swiftshader" in context.adapter_info.lower()
    backend = WebGPUBackend(context, "matmul_direct" if software else "matmul")
    if reuse:
        _shared.append(backend)
    return backend


def post_to_page(message: dict[str, Any]) -> bool:
    """Send a message from the worker to the page (e.g. the device choice); False outside a browser worker."""
    try:
        import js
        from pyodide.ffi import to_js
    except ImportError:
        return False
    post = getattr(js, "postMessage", None)
    if post is None:
        return False
    post(to_js(message, dict_converter=js.Object.fromEntries))
    return True
