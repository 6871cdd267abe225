"""The backend seam: the small set of array primitives every op and optimizer is written against.

The autograd front end (`runtime.autograd`) never touches numpy directly for tensor maths; it calls the
primitives below on the active backend. numpy is the default and the reference backend; a WebGPU backend
implements the same methods over GPU buffers. Backend arrays are opaque to callers except for two attributes,
`.shape` (tuple of ints) and `.dtype` (a numpy dtype). Data enters through `from_numpy` and leaves through
`to_numpy`, the one read-back point (mapping GPU buffers is asynchronous, so it must be rare and explicit).

Primitive list (see `Backend` for signatures):

- transfer: `from_numpy`, `to_numpy`, `zeros`, `full`
- elementwise: `unary(name, x)` with name in UNARY_OPS; `binary(name, x, y)` with name in BINARY_OPS
  (numpy broadcasting; `y` may be a Python float); `where(condition, x, y)`; `compare(name, x, y)` -> bool array
- linear algebra: `matmul(a, b, transpose_a, transpose_b)` (batched, broadcasting batch dimensions)
- reductions: `reduce(name, x, axes, keepdims)` with name in {"sum", "max"}
- layout: `reshape`, `permute`, `broadcast_to`, `slice_axis`, `concatenate`, `index`, `index_add`
- embeddings: `take_rows(table, ids)`, `scatter_add_rows(ids, grad_rows, num_rows)`
- random masks: `dropout_mask(shape, p, rng, dtype)` (already scaled by 1/(1-p))
- fused forward/backward pairs: `gelu`/`gelu_backward`, `softmax`/`softmax_backward`,
  `log_softmax`/`log_softmax_backward`, `cross_entropy`/`cross_entropy_backward`,
  `layer_norm`/`layer_norm_backward`, `causal_attention`/`causal_attention_backward`
- optimizer kernels (update `param` and the state buffers in place): `sgd_momentum_update`, `adam_update`,
  and `squared_norm(x)` -> 0-d array for gradient clipping
"""

from __future__ import annotations

from runtime.backend.base import BINARY_OPS, COMPARE_OPS, UNARY_OPS, Array, Axes, Backend

__all__ = ["BINARY_OPS", "COMPARE_OPS", "UNARY_OPS", "Array", "Axes", "Backend", "get_backend", "set_backend"]

_active: list[Backend] = []


def get_backend() -> Backend:
    """The backend ops run on; the numpy backend unless `set_backend` chose another."""
    if not _active:
        from runtime.backend.numpy_backend import NumpyBackend

        _active.append(NumpyBackend())
    return _active[0]


def set_backend(backend: Backend) -> Backend:
    """Make `backend` the active one and return the previous one (so callers can restore it)."""
    previous = get_backend()
    _active[0] = backend
    return previous
