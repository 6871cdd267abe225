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

from typing import Any, Protocol

import numpy as np

Array = Any  # a backend array: exposes .shape and .dtype, otherwise opaque
Axes = tuple[int, ...] | None

UNARY_OPS = ("neg", "exp", "log", "tanh", "relu", "sqrt", "abs", "sign", "step")  # step: 1.0 where x > 0
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "maximum")
COMPARE_OPS = ("eq", "gt", "ge", "lt", "le", "ne")


class Backend(Protocol):
    """Every primitive the front end uses. Methods return new arrays unless documented as in place."""

    name: str

    def from_numpy(self, array: np.ndarray, dtype: Any = None) -> Array: ...
    def to_numpy(self, x: Array) -> np.ndarray: ...
    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Array: ...
    def full(self, shape: tuple[int, ...], value: float, dtype: Any) -> Array: ...

    def unary(self, op: str, x: Array) -> Array: ...
    def binary(self, op: str, x: Array, y: Array | float) -> Array: ...
    def compare(self, op: str, x: Array, y: Array | float) -> Array: ...
    def where(self, condition: Array, x: Array | float, y: Array | float) -> Array: ...

    def matmul(self, a: Array, b: Array, transpose_a: bool = False, transpose_b: bool = False) -> Array: ...
    def reduce(self, op: str, x: Array, axes: Axes, keepdims: bool) -> Array: ...

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array: ...
    def permute(self, x: Array, axes: tuple[int, ...]) -> Array: ...
    def broadcast_to(self, x: Array, shape: tuple[int, ...]) -> Array: ...
    def slice_axis(self, x: Array, axis: int, start: int, stop: int) -> Array: ...
    def concatenate(self, arrays: list[Array], axis: int) -> Array: ...
    def index(self, x: Array, key: Any) -> Array: ...
    def index_add(self, shape: tuple[int, ...], key: Any, values: Array) -> Array: ...

    def take_rows(self, table: Array, ids: Array) -> Array: ...
    def scatter_add_rows(self, ids: Array, grad_rows: Array, num_rows: int) -> Array: ...
    def dropout_mask(self, shape: tuple[int, ...], p: float, rng: np.random.Generator, dtype: Any) -> Array: ...

    def gelu(self, x: Array) -> tuple[Array, Array]: ...
    def gelu_backward(self, x: Array, gate: Array, grad: Array) -> Array: ...
    def softmax(self, x: Array, axis: int) -> Array: ...
    def softmax_backward(self, y: Array, grad: Array, axis: int) -> Array: ...
    def log_softmax(self, x: Array, axis: int) -> Array: ...
    def log_softmax_backward(self, y: Array, grad: Array, axis: int) -> Array: ...
    def cross_entropy(self, logits: Array, targets: Array, ignore_index: int) -> tuple[Array, Array, int]: ...
    def cross_entropy_backward(
        self, probs: Array, targets: Array, ignore_index: int, count: int, grad: Array
    ) -> Array: ...
    def layer_norm(
        self, x: Array, weight: Array | None, bias: Array | None, eps: float
    ) -> tuple[Array, Array, Array]: ...
    def layer_norm_backward(
        self, normalized: Array, rstd: Array, weight: Array | None, grad: Array, with_bias: bool = True
    ) -> tuple[Array, Array | None, Array | None]: ...
    def causal_attention(self, qkv: Array, n_head: int, dropout_mask: Array | None) -> tuple[Array, Array]: ...
    def causal_attention_backward(
        self, qkv: Array, probs: Array, n_head: int, dropout_mask: Array | None, grad: Array
    ) -> Array: ...

    def sgd_momentum_update(
        self, param: Array, grad: Array, momentum_buffer: Array | None, *, lr: float, momentum: float,
        dampening: float, nesterov: bool, weight_decay: float,
    ) -> Array | None: ...
    def adam_update(
        self, param: Array, grad: Array, exp_avg: Array, exp_avg_sq: Array, *, step: int, lr: float,
        beta_1: float, beta_2: float, eps: float, weight_decay: float, decoupled_weight_decay: bool,
    ) -> None: ...
    def squared_norm(self, x: Array) -> Array: ...


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
