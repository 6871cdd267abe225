"""Differentiable elementwise ops, matmul, reductions and shape ops on `Tensor`.

Each op computes its output with backend primitives and passes `make_result` a closure that accumulates
the gradient into its inputs; broadcasting is undone in exactly one place, `unbroadcast`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.autograd.tensor import Shape, Tensor, as_tensor, make_result, register_ops, tensor
from runtime.autograd.tensor import accumulate_grad as _accumulate
from runtime.backend import Array, get_backend


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
    kept = backend.reduce("max", a.data, axes, True)  # reduced axes kept with size 1

    def backward(grad: Array) -> None:
        winners = backend.compare("eq", a.data, kept)
        ties = backend.reduce("sum", backend.where(winners, backend.full((), 1.0, a.dtype), 0.0), axes, True)
        spread = backend.binary("div", backend.reshape(grad, tuple(kept.shape)), ties)
        _accumulate(a, backend.where(winners, spread, 0.0))

    out_shape = tuple(kept.shape) if keepdims else tuple(n for i, n in enumerate(a.shape) if i not in axes)
    return make_result(backend.reshape(kept, out_shape), (a,), backward)


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


# Tensor's operators and methods call these (tensor.py cannot import this module, which imports it).
register_ops({
    "add": add, "sub": sub, "mul": mul, "div": div, "neg": neg, "power": power, "matmul": matmul, "getitem": getitem,
    "exp": exp, "log": log, "tanh": tanh, "relu": relu, "reduce_sum": reduce_sum, "mean": mean,
    "reduce_max": reduce_max, "reshape": reshape, "permute": permute,
})
