"""The numpy backend: the reference implementation of every primitive listed in `runtime.backend`.

Arrays are plain `np.ndarray`s and keep their dtype (float32 for training, float64 for gradient checks).
Integer ids and targets are host numpy arrays on every backend. Fused kernels work in place on temporaries
they own, so the hot paths (attention, cross-entropy, layer norm, gelu) make as few passes over memory as
numpy allows.

Allocation: a training step frees and reallocates many temporaries of a few hundred KiB to a few MiB. By
default glibc hands such blocks back to the OS (mmap / heap trimming), so every new temporary page-faults
afresh, which made the elementwise kernels 3-5x slower than their arithmetic. On Linux the backend therefore
raises glibc's mmap and trim thresholds once (`mallopt`, through ctypes); freed blocks stay in the process for
reuse. Set PEERTRAIN_MALLOC_TUNING=0 to leave malloc alone. Nothing is changed elsewhere (Pyodide, macOS).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.backend.base import Array, Axes

GELU_COEFF = 0.044715
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

_UNARY = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "sign": np.sign,
}
_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
    "maximum": np.maximum,
}
_REDUCE: dict[str, Any] = {"sum": np.sum, "max": np.max}
_COMPARE = {
    "eq": np.equal,
    "ne": np.not_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "lt": np.less,
    "le": np.less_equal,
}


_ONES: dict[tuple[int, np.dtype], np.ndarray] = {}


def _ones_column(length: int, dtype: Any) -> np.ndarray:
    key = (length, np.dtype(dtype))
    if key not in _ONES:
        _ONES[key] = np.ones((length, 1), dtype=dtype)  # (n, 1)
    return _ONES[key]


def _sum_last_axis(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis, keeping it as size 1. A matrix-vector product with ones: several times faster
    than np.sum over a short contiguous axis."""
    return np.matmul(x, _ones_column(x.shape[-1], x.dtype))


def _sum_rows(x: np.ndarray) -> np.ndarray:
    """Sum a (N, C) array over its rows -> (C,), also as a matrix-vector product."""
    return np.matmul(_ones_column(x.shape[0], x.dtype)[:, 0], x)


def _sum_axis(x: np.ndarray, axis: int) -> np.ndarray:
    return _sum_last_axis(x) if axis in (-1, x.ndim - 1) else np.sum(x, axis=axis, keepdims=True)


def _softmax_in_place(shifted: np.ndarray, axis: int) -> np.ndarray:
    """Softmax of an array the caller owns and has already shifted by its maximum along `axis`."""
    np.exp(shifted, out=shifted)
    shifted /= _sum_axis(shifted, axis)
    return shifted


def keep_freed_memory_in_process() -> bool:
    """Raise glibc's mmap and trim thresholds to 32 MiB / 256 MiB; returns whether both settings took."""
    if not sys.platform.startswith("linux") or os.environ.get("PEERTRAIN_MALLOC_TUNING", "1") == "0":
        return False
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (ImportError, OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))


class NumpyBackend:
    """numpy implementation of the `runtime.backend.Backend` primitives."""

    name = "numpy"

    def __init__(self, tune_malloc: bool = True) -> None:
        self._causal_bias: dict[tuple[int, Any], np.ndarray] = {}
        self.malloc_tuned = keep_freed_memory_in_process() if tune_malloc else False

    # transfer
    def from_numpy(self, array: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.asarray(array, dtype=dtype)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def full(self, shape: tuple[int, ...], value: float, dtype: Any) -> np.ndarray:
        return np.full(shape, value, dtype=dtype)

    # elementwise
    def unary(self, op: str, x: np.ndarray) -> np.ndarray:
        if op == "relu":
            return np.maximum(x, 0)
        if op == "step":
            return (x > 0).astype(x.dtype)
        return _UNARY[op](x)

    def binary(self, op: str, x: np.ndarray, y: np.ndarray | float) -> np.ndarray:
        return _BINARY[op](x, y)

    def compare(self, op: str, x: np.ndarray, y: np.ndarray | float) -> np.ndarray:
        return _COMPARE[op](x, y)

    def where(self, condition: np.ndarray, x: np.ndarray | float, y: np.ndarray | float) -> np.ndarray:
        return np.where(condition, x, y)

    # linear algebra and reductions
    def matmul(self, a: np.ndarray, b: np.ndarray, transpose_a: bool = False, transpose_b: bool = False) -> Array:
        # Swapped axes are strided views; BLAS (and the wasm kernel) read them in place.
        if transpose_a:
            a = np.swapaxes(a, -1, -2)
        if transpose_b:
            b = np.swapaxes(b, -1, -2)
        return _product(a, b)

    def reduce(self, op: str, x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
        if op not in _REDUCE:
            raise ValueError(f"unknown reduction {op!r}")
        leading = len(axes) if axes is not None else x.ndim
        if op == "sum" and not keepdims and axes == tuple(range(leading)) and x.flags.c_contiguous and x.ndim:
            # Sums over leading axes (bias and broadcast gradients) as one matrix-vector product.
            rest = x.shape[leading:]
            return _sum_rows(x.reshape(-1, math.prod(rest))).reshape(rest)
        return _REDUCE[op](x, axis=axes, keepdims=keepdims)

    # layout
    def reshape(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.reshape(x, shape)

    def permute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return np.transpose(x, axes)

    def broadcast_to(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(x, shape)

    def slice_axis(self, x: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
        key = [slice(None)] * x.ndim
        key[axis] = slice(start, stop)
        return x[tuple(key)]

    def concatenate(self, arrays: list[np.ndarray], axis: int) -> np.ndarray:
        return np.concatenate(arrays, axis=axis)

    def index(self, x: np.ndarray, key: Any) -> np.ndarray:
        return x[key]

    def index_add(self, shape: tuple[int, ...], key: Any, values: np.ndarray) -> np.ndarray:
        out = np.zeros(shape, dtype=values.dtype)
        np.add.at(out, key, values)  # repeated indices accumulate
        return out

    # embeddings and masks
    def take_rows(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        # np.intp: int64 indices do not cast "safely" to wasm32's 32-bit intp in Pyodide.
        return np.take(table, np.asarray(ids, dtype=np.intp), axis=0)

    def scatter_add_rows(self, ids: np.ndarray, grad_rows: np.ndarray, num_rows: int) -> np.ndarray:
        width = grad_rows.shape[-1]
        out = np.zeros((num_rows, width), dtype=grad_rows.dtype)
        flat_ids = np.asarray(ids, dtype=np.intp).reshape(-1)  # np.intp: see take_rows
        if flat_ids.size == 0:
            return out
        # Sort the ids and add each run of equal ids with reduceat: several times faster than np.add.at.
        order = np.argsort(flat_ids, kind="stable")
        sorted_ids = flat_ids[order]
        run_starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
        out[sorted_ids[run_starts]] = np.add.reduceat(grad_rows.reshape(-1, width)[order], run_starts, axis=0)
        return out

    def dropout_mask(self, shape: tuple[int, ...], p: float, rng: np.random.Generator, dtype: Any) -> np.ndarray:
        # Always draw float32 uniforms so float32 and float64 models drop the same units for a seed.
        mask = (rng.random(shape, dtype=np.float32) >= p).astype(dtype)
        mask *= 1.0 / (1.0 - p)
        return mask

    # fused kernels
    def gelu(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GELU, tanh approximation (torch approximate="tanh"): y = x * gate with gate = (1 + tanh(u)) / 2,
        u = c (x + a x^3). Returns (y, gate); the gate is all the backward pass needs besides x."""
        gate = x * x
        gate *= GELU_COEFF * SQRT_2_OVER_PI
        gate += SQRT_2_OVER_PI
        gate *= x  # u
        np.tanh(gate, out=gate)
        gate *= 0.5
        gate += 0.5
        return x * gate, gate

    def gelu_backward(self, x: np.ndarray, gate: np.ndarray, grad: np.ndarray) -> np.ndarray:
        # dy/dx = gate + x * (dgate/du) * du/dx with dgate/du = 2 gate (1 - gate), du/dx = c (1 + 3 a x^2),
        # i.e. gate * (1 + 2 c x (1 - gate) (1 + 3 a x^2)).
        dx = x * x
        dx *= 6.0 * GELU_COEFF * SQRT_2_OVER_PI
        dx += 2.0 * SQRT_2_OVER_PI
        dx *= x
        dx *= 1.0 - gate
        dx += 1.0
        dx *= gate
        dx *= grad
        return dx

    def softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        return _softmax_in_place(x - np.max(x, axis=axis, keepdims=True), axis)

    def softmax_backward(self, y: np.ndarray, grad: np.ndarray, axis: int) -> np.ndarray:
        dx = grad - _sum_axis(grad * y, axis)
        dx *= y
        return dx

    def log_softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        shifted = x - np.max(x, axis=axis, keepdims=True)
        shifted -= np.log(_sum_axis(np.exp(shifted), axis))
        return shifted

    def log_softmax_backward(self, y: np.ndarray, grad: np.ndarray, axis: int) -> np.ndarray:
        return grad - np.exp(y) * _sum_axis(grad, axis)

    def cross_entropy(
        self, logits: np.ndarray, targets: np.ndarray, ignore_index: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Mean negative log-likelihood over rows whose target is not ignore_index; logits (N, V), targets (N,).

        Returns (loss as a 0-d array, softmax probabilities for the backward pass, number of counted rows).
        With every row ignored the loss is 0 (torch would give nan).
        """
        rows = np.arange(logits.shape[0])
        valid = targets != ignore_index
        count = int(np.count_nonzero(valid))
        safe_targets = np.where(valid, targets, 0)
        probs = logits - np.max(logits, axis=1, keepdims=True)  # shifted logits, (N, V)
        picked = probs[rows, safe_targets]
        np.exp(probs, out=probs)
        sum_exp = _sum_last_axis(probs)  # (N, 1)
        nll = np.log(sum_exp[:, 0]) - picked
        loss = np.sum(nll * valid) / max(count, 1)
        probs /= sum_exp
        return np.asarray(loss, dtype=logits.dtype), probs, count

    def cross_entropy_backward(
        self, probs: np.ndarray, targets: np.ndarray, ignore_index: int, count: int, grad: np.ndarray
    ) -> np.ndarray:
        valid = targets != ignore_index
        dlogits = probs  # owned by the forward pass and used once, so updated in place
        dlogits[np.arange(probs.shape[0]), np.where(valid, targets, 0)] -= 1.0
        row_scale = valid.astype(probs.dtype) * (grad / max(count, 1))
        dlogits *= row_scale[:, None]
        return dlogits

    def layer_norm(
        self, x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Normalise the last axis; returns (y, normalized x, 1/std) with the last two kept for backward."""
        inverse_width = 1.0 / x.shape[-1]
        normalized = x - _sum_last_axis(x) * inverse_width
        variance = _sum_last_axis(normalized * normalized)
        variance *= inverse_width
        variance += eps
        rstd = 1.0 / np.sqrt(variance)  # (..., 1)
        normalized *= rstd
        y = normalized * weight if weight is not None else normalized.copy()
        if bias is not None:
            y += bias
        return y, normalized, rstd

    def layer_norm_backward(
        self, normalized: np.ndarray, rstd: np.ndarray, weight: np.ndarray | None, grad: np.ndarray,
        with_bias: bool = True,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        width = normalized.shape[-1]
        grad_rows = grad.reshape(-1, width)
        dweight = _sum_rows(grad_rows * normalized.reshape(-1, width)) if weight is not None else None
        dbias = _sum_rows(grad_rows) if with_bias else None
        dnormalized = grad * weight if weight is not None else grad.copy()
        # dx = rstd * (dn - mean(dn) - normalized * mean(dn * normalized)), means over the last axis
        projection = _sum_last_axis(dnormalized * normalized)
        projection *= 1.0 / width
        dx = dnormalized - _sum_last_axis(dnormalized) * (1.0 / width)
        dx -= normalized * projection
        dx *= rstd
        return dx, dweight, dbias

    def _causal_additive_mask(self, length: int, dtype: Any) -> np.ndarray:
        key = (length, np.dtype(dtype))
        if key not in self._causal_bias:
            future = np.triu(np.ones((length, length), dtype=bool), k=1)
            self._causal_bias[key] = np.where(future, -np.inf, 0.0).astype(dtype)  # (T, T)
        return self._causal_bias[key]

    def causal_attention(
        self, qkv: np.ndarray, n_head: int, dropout_mask: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Causal multi-head attention on packed projections qkv (B, T, 3C) -> (y (B, T, C), probs (B, nh, T, T))."""
        batch, length, width3 = qkv.shape
        head_size = width3 // (3 * n_head)
        heads = qkv.reshape(batch, length, 3, n_head, head_size).transpose(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        query, key, value = heads[0], heads[1], heads[2]
        scores = _product(query, np.swapaxes(key, -1, -2))  # (B, nh, T, T)
        scores *= 1.0 / math.sqrt(head_size)
        scores += self._causal_additive_mask(length, qkv.dtype)
        scores -= np.max(scores, axis=-1, keepdims=True)
        probs = _softmax_in_place(scores, axis=-1)
        attended = probs * dropout_mask if dropout_mask is not None else probs
        y = _product(attended, value)  # (B, nh, T, hs)
        return y.transpose(0, 2, 1, 3).reshape(batch, length, width3 // 3), probs

    def causal_attention_backward(
        self, qkv: np.ndarray, probs: np.ndarray, n_head: int, dropout_mask: np.ndarray | None, grad: np.ndarray
    ) -> np.ndarray:
        batch, length, width3 = qkv.shape
        head_size = width3 // (3 * n_head)
        heads = qkv.reshape(batch, length, 3, n_head, head_size).transpose(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        query, key, value = heads[0], heads[1], heads[2]
        grad_y = grad.reshape(batch, length, n_head, head_size).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
        dheads = np.empty((3, batch, n_head, length, head_size), dtype=qkv.dtype)
        attended = probs * dropout_mask if dropout_mask is not None else probs
        _product(np.swapaxes(attended, -1, -2), grad_y, out=dheads[2])  # dv
        dprobs = _product(grad_y, np.swapaxes(value, -1, -2))  # (B, nh, T, T)
        if dropout_mask is not None:
            dprobs *= dropout_mask
        dscores = self.softmax_backward(probs, dprobs, axis=-1)
        dscores *= 1.0 / math.sqrt(head_size)
        _product(dscores, key, out=dheads[0])  # dq
        _product(np.swapaxes(dscores, -1, -2), query, out=dheads[1])  # dk
        return dheads.transpose(1, 3, 0, 2, 4).reshape(batch, length, width3)

    # optimizer kernels
    def sgd_momentum_update(
        self, param: np.ndarray, grad: np.ndarray, momentum_buffer: np.ndarray | None, *, lr: float,
        momentum: float, dampening: float, nesterov: bool, weight_decay: float,
    ) -> np.ndarray | None:
        """torch.optim.SGD step for one parameter, in place; returns the (possibly new) momentum buffer."""
        direction = grad + weight_decay * param if weight_decay else grad
        if momentum:
            if momentum_buffer is None:
                momentum_buffer = np.array(direction, copy=True)
            else:
                momentum_buffer *= momentum
                momentum_buffer += (1.0 - dampening) * direction
            direction = direction + momentum * momentum_buffer if nesterov else momentum_buffer
        param -= lr * direction
        return momentum_buffer

    def adam_update(
        self, param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *, step: int,
        lr: float, beta_1: float, beta_2: float, eps: float, weight_decay: float, decoupled_weight_decay: bool,
    ) -> None:
        """torch.optim.Adam / AdamW step for one parameter, in place (bias-corrected, eps outside the sqrt)."""
        if weight_decay and decoupled_weight_decay:
            param *= 1.0 - lr * weight_decay
        elif weight_decay:
            grad = grad + weight_decay * param
        exp_avg *= beta_1
        exp_avg += (1.0 - beta_1) * grad
        exp_avg_sq *= beta_2
        exp_avg_sq += (1.0 - beta_2) * (grad * grad)
        bias_correction_1 = 1.0 - beta_1**step
        bias_correction_2 = 1.0 - beta_2**step
        denom = np.sqrt(exp_avg_sq)
        denom *= 1.0 / math.sqrt(bias_correction_2)
        denom += eps
        update = exp_avg / denom
        update *= lr / bias_correction_1
        param -= update

    def squared_norm(self, x: np.ndarray) -> np.ndarray:
        flat = x.reshape(-1)
        return np.asarray(np.dot(flat, flat))


# Pyodide's numpy has no BLAS; its worker installs runtime.backend.wasm_gemm's SIMD kernel here. A kernel
# returns a @ b (numpy's matmul semantics for arrays of 2 or more axes), or None for a case it leaves to numpy.
MatmulKernel = Callable[[np.ndarray, np.ndarray], "np.ndarray | None"]
_matmul_kernel: MatmulKernel | None = None
_matmul_name = ""  # the installed kernel's name (its sums' order is part of a peer's engine class)


def use_matmul(kernel: MatmulKernel | None, name: str = "matmul-kernel") -> None:
    """Route matmuls through ``kernel`` (called ``name``) first; None: numpy's own again."""
    global _matmul_kernel, _matmul_name
    _matmul_kernel, _matmul_name = kernel, name if kernel is not None else ""


def matmul_kernel() -> str:
    """The name of the matmul kernel installed in place of numpy's ("" for numpy's own)."""
    return _matmul_name


def _product(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)``, through the installed kernel when there is one."""
    if _matmul_kernel is not None:
        product = _matmul_kernel(a, b)
        if product is not None:
            if out is None:
                return product
            out[...] = product
            return out
    return np.matmul(a, b, out=out)
