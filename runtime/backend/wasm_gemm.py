"""float32 matrix products for Pyodide: a WebAssembly SIMD kernel that numpy's buffers are handed to in place.

Pyodide's numpy has no BLAS (its matmul is a plain loop), and scipy's OpenBLAS there is a generic build
without SIMD. This kernel computes blocks of 4 rows x 8 columns with 128-bit vectors (8 accumulators);
a column tail of fewer than 8 runs scalar. Every output element is summed in the same order,
``((0 + a0*b0) + a1*b1) + ...``, with separate multiply and add (no fused or relaxed operations), so a
result does not depend on the block it fell in, nor on the machine: the same inputs give the same bits
in every browser.

``op(A)`` is read through byte strides (rows and the summed axis), so ``A`` and ``A.T`` need no copy;
``op(B)`` needs contiguous rows. Batches are a fourth loop with one stride per operand (0 broadcasts).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from runtime.backend.numpy_backend import use_matmul
from runtime.backend.wasm import Function, side_module

# Rows of A per block: 8 accumulators + 2 rows of B + 1 splat fit 16 vector registers; 6 and 8 rows measured
# 20-30% slower in V8.
ROWS = 4
SYMBOL = "peertrain_sgemm"
PARAMS = ["a", "b", "c", "m", "n", "k", "a_rs", "a_ks", "b_rs", "batch", "a_bs", "b_bs", "c_bs"]


def _while(label: str, exit_when: list[str], body: list[str]) -> list[str]:
    """``while not exit_when: body`` as a block around a loop."""
    return [f"block ${label}_done", f"loop ${label}", *exit_when, f"br_if ${label}_done", *body,
            f"br ${label}", "end", "end"]


def _add(target: str, amount: str) -> list[str]:
    return [f"local.get ${target}", f"local.get ${amount}", "i32.add", f"local.set ${target}"]


def _tile(rows: int) -> list[str]:
    """C[i:i+rows, j:j+8] = op(A)[i:i+rows] @ op(B)[:, j:j+8]; pointers from $i and $j."""
    lines = ["local.get $a", "local.get $i", "local.get $a_rs", "i32.mul", "i32.add", "local.set $pa0"]
    for r in range(1, rows):
        lines += [f"local.get $pa{r - 1}", "local.get $a_rs", "i32.add", f"local.set $pa{r}"]
    lines += ["local.get $b", "local.get $j", "i32.const 2", "i32.shl", "i32.add", "local.set $pb"]
    accumulators = [f"$acc{r}{h}" for r in range(rows) for h in range(2)]
    lines += ["v128.const i32x4 0 0 0 0", *[f"local.tee {acc}" for acc in accumulators[:-1]],
              f"local.set {accumulators[-1]}", "local.get $k", "local.set $kk", f"loop $k{rows}",
              "local.get $pb", "v128.load", "local.set $b0", "local.get $pb", "v128.load offset=16", "local.set $b1"]
    for r in range(rows):
        lines += [f"local.get $pa{r}", "v128.load32_splat", "local.set $s"]
        for h in range(2):
            lines += [f"local.get $acc{r}{h}", "local.get $s", f"local.get $b{h}", "f32x4.mul", "f32x4.add",
                      f"local.set $acc{r}{h}"]
        lines += _add(f"pa{r}", "a_ks")
    lines += _add("pb", "b_rs")
    lines += ["local.get $kk", "i32.const 1", "i32.sub", "local.tee $kk", f"br_if $k{rows}", "end"]
    # pc = c + (i * n + j) * 4, then one row of C per n * 4 bytes.
    lines += ["local.get $c", "local.get $i", "local.get $n", "i32.mul", "local.get $j", "i32.add", "i32.const 2",
              "i32.shl", "i32.add", "local.set $pc"]
    for r in range(rows):
        lines += ["local.get $pc", f"local.get $acc{r}0", "v128.store",
                  "local.get $pc", f"local.get $acc{r}1", "v128.store offset=16"]
        lines += _add("pc", "c_rs")
    return lines


def _rows_then_tail() -> list[str]:
    """Every row of the 8 columns at $j: blocks of ROWS rows, then single rows."""
    step_rows = ["local.get $i", f"i32.const {ROWS}", "i32.add", "local.set $i"]
    step_one = ["local.get $i", "i32.const 1", "i32.add", "local.set $i"]
    return ["i32.const 0", "local.set $i",
            *_while("rows", ["local.get $i", f"i32.const {ROWS}", "i32.add", "local.get $m", "i32.gt_u"],
                    _tile(ROWS) + step_rows),
            *_while("row", ["local.get $i", "local.get $m", "i32.ge_u"], _tile(1) + step_one)]


def _scalar_column() -> list[str]:
    """C[:, j] for one column $j, one dot product per row, in the same order as the vector blocks."""
    dot = ["local.get $a", "local.get $i", "local.get $a_rs", "i32.mul", "i32.add", "local.set $pa0",
           "local.get $b", "local.get $j", "i32.const 2", "i32.shl", "i32.add", "local.set $pb",
           "f32.const 0", "local.set $t", "local.get $k", "local.set $kk", "loop $kdot",
           "local.get $t", "local.get $pa0", "f32.load", "local.get $pb", "f32.load", "f32.mul", "f32.add",
           "local.set $t", *_add("pa0", "a_ks"), *_add("pb", "b_rs"),
           "local.get $kk", "i32.const 1", "i32.sub", "local.tee $kk", "br_if $kdot", "end",
           "local.get $c", "local.get $i", "local.get $n", "i32.mul", "local.get $j", "i32.add", "i32.const 2",
           "i32.shl", "i32.add", "local.get $t", "f32.store",
           "local.get $i", "i32.const 1", "i32.add", "local.set $i"]
    return ["i32.const 0", "local.set $i", *_while("dot", ["local.get $i", "local.get $m", "i32.ge_u"], dot)]


def gemm_function() -> Function:
    """``peertrain_sgemm(a, b, c, m, n, k, a_rs, a_ks, b_rs, batch, a_bs, b_bs, c_bs)``, strides in bytes.

    For each of ``batch`` products: C[m, n] (rows contiguous) = op(A)[m, k] @ op(B)[k, n], where
    op(A)[i, p] is at ``a + i*a_rs + p*a_ks`` and op(B)[p, j] at ``b + p*b_rs + 4*j``. Needs k >= 1.
    """
    columns = ["i32.const 0", "local.set $j",
               *_while("cols", ["local.get $j", "i32.const 8", "i32.add", "local.get $n", "i32.gt_u"],
                       _rows_then_tail() + ["local.get $j", "i32.const 8", "i32.add", "local.set $j"]),
               *_while("tail", ["local.get $j", "local.get $n", "i32.ge_u"],
                       _scalar_column() + ["local.get $j", "i32.const 1", "i32.add", "local.set $j"])]
    body = ["local.get $n", "i32.const 2", "i32.shl", "local.set $c_rs",
            *_while("batches", ["local.get $batch", "i32.eqz"],
                    columns + _add("a", "a_bs") + _add("b", "b_bs") + _add("c", "c_bs")
                    + ["local.get $batch", "i32.const 1", "i32.sub", "local.set $batch"])]
    scalars = ["i", "j", "kk", "pb", "pc", "c_rs"] + [f"pa{r}" for r in range(ROWS)]
    vectors = ["b0", "b1", "s"] + [f"acc{r}{h}" for r in range(ROWS) for h in range(2)]
    return Function(SYMBOL, [(name, "i32") for name in PARAMS], "\n".join(body),
                    locals=[(name, "i32") for name in scalars] + [("t", "f32")] + [(name, "v128") for name in vectors])


def module_bytes() -> bytes:
    return side_module([gemm_function()])


def load() -> Callable[..., None]:
    """Write the side module into Pyodide's file system and load it with ctypes; returns the C function."""
    import ctypes
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"{SYMBOL}.so")
    with open(path, "wb") as handle:
        handle.write(module_bytes())
    function = getattr(ctypes.CDLL(path), SYMBOL)
    function.argtypes = [ctypes.c_uint32] * 3 + [ctypes.c_int32] * (len(PARAMS) - 3)
    function.restype = None
    return function


def _batch_stride(array: np.ndarray, batch: tuple[int, ...]) -> int | None:
    """The one stride that steps through ``array``'s leading (batch) axes in order, or None when there is none."""
    view = np.broadcast_to(array, batch + array.shape[-2:])
    stride = view.strides[len(batch) - 1] if batch else 0
    for axis in range(len(batch) - 1):
        if batch[axis] > 1 and view.strides[axis] != view.strides[axis + 1] * batch[axis + 1]:
            return None
    return stride


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def matmul(gemm: Callable[..., None], a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``a @ b`` through ``gemm`` (see ``load``); None where this kernel does not apply (numpy's turn).

    Any strides work for ``a`` (a transposed view included); ``b`` is copied unless its rows are contiguous.
    """
    if a.dtype != np.float32 or b.dtype != np.float32 or a.ndim < 2 or b.ndim < 2:
        return None
    if min(a.strides) < 0:
        a = np.ascontiguousarray(a)
    if b.strides[-1] != 4 or min(b.strides) < 0:
        b = np.ascontiguousarray(b)
    (m, k), n = a.shape[-2:], b.shape[-1]
    if b.shape[-2] != k:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not agree")
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    if not math.prod(batch) * m * n * k:
        return None  # an empty product: numpy's
    a_bs, b_bs = _batch_stride(a, batch), _batch_stride(b, batch)
    if a_bs is None:
        a = np.ascontiguousarray(np.broadcast_to(a, batch + a.shape[-2:]))
        a_bs = m * k * 4
    if b_bs is None:
        b = np.ascontiguousarray(np.broadcast_to(b, batch + b.shape[-2:]))
        b_bs = k * n * 4
    out = np.empty(batch + (m, n), dtype=np.float32)
    gemm(_address(a), _address(b), _address(out), m, n, k, a.strides[-2], a.strides[-1], b.strides[-2],
         math.prod(batch), a_bs, b_bs, m * n * 4)
    return out


def install() -> str:
    """Load the kernel and make it the numpy backend's matmul (Pyodide only); returns what the page shows."""
    gemm = load()
    use_matmul(lambda a, b: matmul(gemm, a, b), f"wasm-simd-gemm-{ROWS}x8")
    return f"WebAssembly SIMD kernel ({ROWS}x8 blocks)"
