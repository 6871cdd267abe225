"""Reverse-mode autograd over backend arrays: the `Tensor` node, its arithmetic, shape ops and reductions.

Every op computes its output with backend primitives and records a backward closure that *accumulates* into
its parents' `.grad`. `Tensor.backward()` orders the graph with an iterative depth-first search (no recursion,
parents kept in tuples so the order is deterministic), runs the closures in reverse and frees the graph.
A Tensor keeps the dtype of its data: float32 for training, float64 (see `default_dtype`) for gradient checks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from runtime.backend import Array, get_backend

BackwardFn = Callable[[Array], None]
Shape = tuple[int, ...]


class _AutogradState:
    grad_enabled = True
    default_dtype: np.dtype = np.dtype(np.float32)


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Within this block ops record no graph (inference, evaluation, generation)."""
    previous = _AutogradState.grad_enabled
    _AutogradState.grad_enabled = False
    try:
        yield
    finally:
        _AutogradState.grad_enabled = previous


def is_grad_enabled() -> bool:
    return _AutogradState.grad_enabled


@contextlib.contextmanager
def default_dtype(dtype: Any) -> Iterator[None]:
    """Within this block new floating tensors and parameters use `dtype` (e.g. np.float64 for gradient checks)."""
    previous = _AutogradState.default_dtype
    _AutogradState.default_dtype = np.dtype(dtype)
    try:
        yield
    finally:
        _AutogradState.default_dtype = previous


def get_default_dtype() -> np.dtype:
    return _AutogradState.default_dtype


def _graph_freed(grad: Array) -> None:
    raise RuntimeError("backward through a graph a second time: its buffers were freed by the first backward()")


class Tensor:
    """A node in the autograd graph holding one backend array (`data`) and, after backward, its `grad`."""

    __slots__ = ("data", "grad", "requires_grad", "_parents", "_backward")
    __array_priority__ = 1000  # numpy defers `ndarray * Tensor` to Tensor.__rmul__

    def __init__(self, data: Array, requires_grad: bool = False) -> None:
        self.data = data
        self.grad: Array | None = None
        self.requires_grad = requires_grad
        self._parents: tuple[Tensor, ...] = ()
        self._backward: BackwardFn | None = None

    @property
    def shape(self) -> Shape:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    def numpy(self) -> np.ndarray:
        """The data as a numpy array (the backend's read-back point; no copy on the numpy backend)."""
        return get_backend().to_numpy(self.data)

    def item(self) -> float:
        return float(self.numpy())

    def detach(self) -> Tensor:
        return Tensor(self.data)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, requires_grad={self.requires_grad})"

    def backward(self, grad: Array | None = None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's `.grad`; `grad` defaults to 1 for a scalar."""
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad")
        if grad is None:
            if self.shape != ():
                raise RuntimeError(f"backward() without a gradient needs a scalar, got shape {self.shape}")
            grad = get_backend().full((), 1.0, self.dtype)
        _accumulate(self, grad)
        for node in reversed(_topological_order(self)):
            if node._backward is None:
                continue  # a leaf: its .grad is the result
            if node.grad is not None:
                node._backward(node.grad)
            # Free the graph as we go, like torch without retain_graph: intermediates drop their grads.
            node.grad = None
            node._parents = ()
            node._backward = _graph_freed

    # arithmetic (operands may be Tensors, numpy arrays or Python numbers)
    def __add__(self, other: Any) -> Tensor:
        return add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return sub(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return sub(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return mul(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return mul(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return div(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return div(other, self)

    def __neg__(self) -> Tensor:
        return neg(self)

    def __pow__(self, exponent: Any) -> Tensor:
        return power(self, exponent)

    def __matmul__(self, other: Tensor) -> Tensor:
        return matmul(self, other)

    def __getitem__(self, key: Any) -> Tensor:
        return getitem(self, key)

    def exp(self) -> Tensor:
        return exp(self)

    def log(self) -> Tensor:
        return log(self)

    def tanh(self) -> Tensor:
        return tanh(self)

    def relu(self) -> Tensor:
        return relu(self)

    def sum(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return reduce_sum(self, axis, keepdims)

    def mean(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return mean(self, axis, keepdims)

    def max(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return reduce_max(self, axis, keepdims)

    def reshape(self, *shape: int) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return reshape(self, shape)

    def transpose(self, *axes: int) -> Tensor:
        return permute(self, axes if axes else tuple(reversed(range(self.ndim))))

    permute = transpose

    @property
    def T(self) -> Tensor:  # noqa: N802 - numpy's name
        return permute(self, tuple(reversed(range(self.ndim))))


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A leaf Tensor from numpy data; floating data takes `dtype` or the default dtype, integers stay integers."""
    array = np.asarray(data)
    if dtype is None and (array.dtype.kind == "f" or array.dtype.kind in "iub" and requires_grad):
        dtype = get_default_dtype()
    return Tensor(get_backend().from_numpy(array, dtype), requires_grad=requires_grad)


def as_tensor(value: Any, like: Tensor) -> Tensor:
    """Wrap a Python number or numpy array as a constant in `like`'s floating dtype (booleans stay boolean)."""
    if isinstance(value, Tensor):
        return value
    array = np.asarray(value)
    dtype = array.dtype if array.dtype.kind == "b" else like.dtype
    return Tensor(get_backend().from_numpy(array, dtype))


def make_result(data: Array, parents: tuple[Tensor, ...], backward: BackwardFn) -> Tensor:
    """The output node of an op: records `backward` only when grad mode is on and some parent needs a grad."""
    out = Tensor(data)
    if _AutogradState.grad_enabled and any(parent.requires_grad for parent in parents):
        out.requires_grad = True
        out._parents = parents
        out._backward = backward
    return out


def _accumulate(target: Tensor, grad: Array) -> None:
    # Gradients are never mutated in place, so one array may be shared by several tensors' .grad.
    if not target.requires_grad:
        return
    if tuple(grad.shape) != target.shape:
        raise RuntimeError(f"gradient shape {tuple(grad.shape)} does not match tensor shape {target.shape}")
    target.grad = grad if target.grad is None else get_backend().binary("add", target.grad, grad)


accumulate_grad = _accumulate


def _topological_order(root: Tensor) -> list[Tensor]:
    """Nodes that need a grad, each after all of its parents (iterative depth-first post-order)."""
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in reversed(node._parents):
            if parent.requires_grad and id(parent) not in visited:
                stack.append((parent, False))
    return order


def unbroadcast(grad: Array, shape: Shape) -> Array:
    """Sum a broadcast gradient back down to `shape` (the one place broadcasting is undone)."""
    grad_shape = tuple(grad.shape)
    if grad_shape == shape:
        return grad
    extra = len(grad_shape) - len(shape)
    axes = tuple(range(extra)) + tuple(
        extra + i for i, size in enumerate(shape) if size == 1 and grad_shape[extra + i] != 1
    )
    backend = get_backend()
    summed = backend.reduce("sum", grad, axes, False) if axes else grad
    return backend.reshape(summed, shape)


# elementwise ops
def _binary_operands(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    if isinstance(a, Tensor):
        return a, as_tensor(b, a)
    b = b if isinstance(b, Tensor) else tensor(b)
    return as_tensor(a, b), b


def add(a: Any, b: Any) -> Tensor:
    a, b = _binary_operands(a, b)

    def backward(grad: Array) -> None:
        _accumulate(a, unbroadcast(grad, a.shape))
        _accumulate(b, unbroadcast(grad, b.shape))

    return make_result(get_backend().binary("add", a.data, b.data), (a, b), backward)


def sub(a: Any, b: Any) -> Tensor:
    a, b = _binary_operands(a, b)

    def backward(grad: Array) -> None:
        _accumulate(a, unbroadcast(grad, a.shape))
        if b.requires_grad:
            _accumulate(b, unbroadcast(get_backend().unary("neg", grad), b.shape))

    return make_result(get_backend().binary("sub", a.data, b.data), (a, b), backward)


def mul(a: Any, b: Any) -> Tensor:
    a, b = _binary_operands(a, b)

    def backward(grad: Array) -> None:
        backend = get_backend()
        if a.requires_grad:
            _accumulate(a, unbroadcast(backend.binary("mul", grad, b.data), a.shape))
        if b.requires_grad:
            _accumulate(b, unbroadcast(backend.binary("mul", grad, a.data), b.shape))

    return make_result(get_backend().binary("mul", a.data, b.data), (a, b), backward)


def div(a: Any, b: Any) -> Tensor:
    a, b = _binary_operands(a, b)
    backend = get_backend()
    quotient = backend.binary("div", a.data, b.data)

    def backward(grad: Array) -> None:
        grad_over_b = backend.binary("div", grad, b.data)
        _accumulate(a, unbroadcast(grad_over_b, a.shape))
        if b.requires_grad:  # d(a/b)/db = -(a/b)/b
            _accumulate(b, unbroadcast(backend.unary("neg", backend.binary("mul", grad_over_b, quotient)), b.shape))

    return make_result(quotient, (a, b), backward)


def neg(a: Tensor) -> Tensor:
    backend = get_backend()
    return make_result(backend.unary("neg", a.data), (a,), lambda grad: _accumulate(a, backend.unary("neg", grad)))


def power(base: Any, exponent: Any) -> Tensor:
    """base ** exponent; a constant exponent is the common case, a Tensor exponent needs a positive base."""
    base, exponent = _binary_operands(base, exponent)
    backend = get_backend()
    out = backend.binary("pow", base.data, exponent.data)

    def backward(grad: Array) -> None:
        if base.requires_grad:  # exponent * base ** (exponent - 1)
            lowered = backend.binary("pow", base.data, backend.binary("sub", exponent.data, 1.0))
            slope = backend.binary("mul", exponent.data, lowered)
            _accumulate(base, unbroadcast(backend.binary("mul", grad, slope), base.shape))
        if exponent.requires_grad:  # base ** exponent * log(base)
            slope = backend.binary("mul", out, backend.unary("log", base.data))
            _accumulate(exponent, unbroadcast(backend.binary("mul", grad, slope), exponent.shape))

    return make_result(out, (base, exponent), backward)


def exp(a: Tensor) -> Tensor:
    backend = get_backend()
    out = backend.unary("exp", a.data)
    return make_result(out, (a,), lambda grad: _accumulate(a, backend.binary("mul", grad, out)))


def log(a: Tensor) -> Tensor:
    backend = get_backend()
    return make_result(
        backend.unary("log", a.data), (a,), lambda grad: _accumulate(a, backend.binary("div", grad, a.data))
    )


def tanh(a: Tensor) -> Tensor:
    backend = get_backend()
    out = backend.unary("tanh", a.data)

    def backward(grad: Array) -> None:  # grad * (1 - tanh^2) = grad - grad * tanh^2
        grad_times_square = backend.binary("mul", grad, backend.binary("mul", out, out))
        _accumulate(a, backend.binary("sub", grad, grad_times_square))

    return make_result(out, (a,), backward)


def relu(a: Tensor) -> Tensor:
    backend = get_backend()
    return make_result(
        backend.unary("relu", a.data),
        (a,),
        lambda grad: _accumulate(a, backend.binary("mul", grad, backend.unary("step", a.data))),
    )


# linear algebra
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Batched matrix product of (..., n, k) and (..., k, m); batch dimensions broadcast."""
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul needs operands with at least 2 dimensions, got {a.shape} and {b.shape}")
    backend = get_backend()

    def backward(grad: Array) -> None:
        if a.requires_grad:
            _accumulate(a, unbroadcast(backend.matmul(grad, b.data, transpose_b=True), a.shape))
        if b.requires_grad:
            _accumulate(b, unbroadcast(backend.matmul(a.data, grad, transpose_a=True), b.shape))

    return make_result(backend.matmul(a.data, b.data), (a, b), backward)


# reductions
def _normalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % ndim for a in axes))


def _kept_shape(shape: Shape, axes: tuple[int, ...]) -> Shape:
    return tuple(1 if i in axes else size for i, size in enumerate(shape))


def reduce_sum(a: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    backend = get_backend()
    axes = _normalize_axes(axis, a.ndim)

    def backward(grad: Array) -> None:
        _accumulate(a, backend.broadcast_to(backend.reshape(grad, _kept_shape(a.shape, axes)), a.shape))

    return make_result(backend.reduce("sum", a.data, axes, keepdims), (a,), backward)


def mean(a: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    axes = _normalize_axes(axis, a.ndim)
    count = 1
    for i in axes:
        count *= a.shape[i]
    return mul(reduce_sum(a, axes, keepdims), 1.0 / count)


def reduce_max(a: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """Maximum over axes; the gradient is shared equally among tied maxima (like torch.amax)."""
    backend = get_backend()
    axes = _normalize_axes(axis, a.ndim)
    kept = backend.reduce("max", a.data, axes, True)

    def backward(grad: Array) -> None:
        winners = backend.compare("eq", a.data, kept)
        share = backend.where(winners, 1.0, 0.0)
        share = backend.binary("div", share, backend.reduce("sum", share, axes, True))
        _accumulate(a, backend.binary("mul", share.astype(a.dtype), backend.reshape(grad, kept.shape)))

    return make_result(kept if keepdims else backend.reshape(kept, tuple(grad_shape_without(a.shape, axes))), (a,), backward)


def grad_shape_without(shape: Shape, axes: tuple[int, ...]) -> Shape:
    return tuple(size for i, size in enumerate(shape) if i not in axes)


# shape ops
def reshape(a: Tensor, shape: Sequence[int]) -> Tensor:
    backend = get_backend()
    return make_result(
        backend.reshape(a.data, tuple(shape)), (a,), lambda grad: _accumulate(a, backend.reshape(grad, a.shape))
    )


def permute(a: Tensor, axes: Sequence[int]) -> Tensor:
    backend = get_backend()
    axes = tuple(axis % a.ndim for axis in axes)
    inverse = tuple(int(i) for i in np.argsort(axes))
    return make_result(
        backend.permute(a.data, axes), (a,), lambda grad: _accumulate(a, backend.permute(grad, inverse))
    )


def getitem(a: Tensor, key: Any) -> Tensor:
    """numpy indexing (slices, integers, integer arrays); repeated indices accumulate in the backward pass."""
    if isinstance(key, Tensor):
        key = key.numpy()
    elif isinstance(key, tuple):
        key = tuple(part.numpy() if isinstance(part, Tensor) else part for part in key)
    backend = get_backend()
    return make_result(
        backend.index(a.data, key), (a,), lambda grad: _accumulate(a, backend.index_add(a.shape, key, grad))
    )
