"""Reverse-mode autograd over backend arrays: the `Tensor` node, its arithmetic, shape ops and reductions.

Every op computes its output with backend primitives and records a backward closure that *accumulates* into
its parents' `.grad`. `Tensor.backward()` orders the graph with an iterative depth-first search (no recursion,
parents kept in tuples so the order is deterministic), runs the closures in reverse and frees the graph.
A Tensor keeps the dtype of its data: float32 for training, float64 (see `default_dtype`) for gradient checks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from runtime.backend import Array, get_backend

BackwardFn = Callable[[Array], None]
Shape = tuple[int, ...]


class _AutogradState(threading.local):
    """Per thread (the relay replays units in one thread while another validates under ``no_grad``); the class
    attributes are each thread's starting values."""

    grad_enabled = True
    default_dtype: np.dtype = np.dtype(np.float32)


_STATE = _AutogradState()


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Within this block ops record no graph (inference, evaluation, generation)."""
    previous = _STATE.grad_enabled
    _STATE.grad_enabled = False
    try:
        yield
    finally:
        _STATE.grad_enabled = previous


def is_grad_enabled() -> bool:
    return _STATE.grad_enabled


@contextlib.contextmanager
def default_dtype(dtype: Any) -> Iterator[None]:
    """Within this block new floating tensors and parameters use `dtype` (e.g. np.float64 for gradient checks)."""
    previous = _STATE.default_dtype
    _STATE.default_dtype = np.dtype(dtype)
    try:
        yield
    finally:
        _STATE.default_dtype = previous


def get_default_dtype() -> np.dtype:
    return _STATE.default_dtype


# The ops behind Tensor's operators and methods, by name. `runtime.autograd.ops` (which builds on this module, so
# this module must not import it) registers them when imported; `runtime.autograd` imports it, so importing any
# part of the package fills the table before a Tensor exists.
_OPS: dict[str, Callable[..., Tensor]] = {}
OP_NAMES = ("add", "sub", "mul", "div", "neg", "power", "matmul", "getitem", "exp", "log", "tanh", "relu",
            "reduce_sum", "mean", "reduce_max", "reshape", "permute")


def register_ops(ops: dict[str, Callable[..., Tensor]]) -> None:
    """Install the functions behind Tensor's operators (called once, by `runtime.autograd.ops`)."""
    missing = sorted(set(OP_NAMES) - set(ops))
    if missing:
        raise RuntimeError(f"autograd ops missing: {missing}")
    _OPS.update(ops)


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
        accumulate_grad(self, grad)
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
        return _OPS["add"](self, other)

    def __radd__(self, other: Any) -> Tensor:
        return _OPS["add"](other, self)

    def __sub__(self, other: Any) -> Tensor:
        return _OPS["sub"](self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return _OPS["sub"](other, self)

    def __mul__(self, other: Any) -> Tensor:
        return _OPS["mul"](self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return _OPS["mul"](other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return _OPS["div"](self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _OPS["div"](other, self)

    def __neg__(self) -> Tensor:
        return _OPS["neg"](self)

    def __pow__(self, exponent: Any) -> Tensor:
        return _OPS["power"](self, exponent)

    def __matmul__(self, other: Tensor) -> Tensor:
        return _OPS["matmul"](self, other)

    def __getitem__(self, key: Any) -> Tensor:
        return _OPS["getitem"](self, key)

    def exp(self) -> Tensor:
        return _OPS["exp"](self)

    def log(self) -> Tensor:
        return _OPS["log"](self)

    def tanh(self) -> Tensor:
        return _OPS["tanh"](self)

    def relu(self) -> Tensor:
        return _OPS["relu"](self)

    def sum(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _OPS["reduce_sum"](self, axis, keepdims)

    def mean(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _OPS["mean"](self, axis, keepdims)

    def max(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _OPS["reduce_max"](self, axis, keepdims)

    def reshape(self, *shape: int) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return _OPS["reshape"](self, shape)

    def transpose(self, *axes: int) -> Tensor:
        return _OPS["permute"](self, axes if axes else tuple(reversed(range(self.ndim))))

    permute = transpose

    @property
    def T(self) -> Tensor:  # noqa: N802 - numpy's name
        return _OPS["permute"](self, tuple(reversed(range(self.ndim))))


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
    if _STATE.grad_enabled and any(parent.requires_grad for parent in parents):
        out.requires_grad = True
        out._parents = parents
        out._backward = backward
    return out


def accumulate_grad(target: Tensor, grad: Array) -> None:
    # Gradients are never mutated in place, so one array may be shared by several tensors' .grad.
    if not target.requires_grad:
        return
    if tuple(grad.shape) != target.shape:
        raise RuntimeError(f"gradient shape {tuple(grad.shape)} does not match tensor shape {target.shape}")
    target.grad = grad if target.grad is None else get_backend().binary("add", target.grad, grad)


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

