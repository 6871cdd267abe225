"""Differentiable neural-network ops built on the backend's fused kernels (the hot paths of training).

linear, gelu, softmax, log_softmax, cross_entropy, layer_norm, embedding, dropout, causal_self_attention,
plus where / masked_fill and concatenate / split. Integer inputs (ids, targets) are host numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.autograd.ops import unbroadcast
from runtime.autograd.tensor import Tensor, as_tensor, make_result
from runtime.autograd.tensor import accumulate_grad as _accumulate
from runtime.backend import Array, get_backend


def _host_ints(values: Any) -> np.ndarray:
    array = values.numpy() if isinstance(values, Tensor) else np.asarray(values)
    if array.dtype.kind not in "iu":
        raise TypeError(f"expected an integer array of ids or targets, got dtype {array.dtype}")
    return array


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (..., in) @ weight.T + bias with weight (out, in) like torch; leading axes fold into one GEMM."""
    backend = get_backend()
    out_features, in_features = weight.shape
    if x.shape[-1] != in_features:
        raise ValueError(f"linear: input has {x.shape[-1]} features, weight expects {in_features}")
    rows = backend.reshape(x.data, (-1, in_features))  # (N, in)
    y = backend.matmul(rows, weight.data, transpose_b=True)  # (N, out)
    if bias is not None:
        y = backend.binary("add", y, bias.data)

    def backward(grad: Array) -> None:
        grad_rows = backend.reshape(grad, (-1, out_features))  # (N, out)
        if x.requires_grad:
            _accumulate(x, backend.reshape(backend.matmul(grad_rows, weight.data), x.shape))
        if weight.requires_grad:
            _accumulate(weight, backend.matmul(grad_rows, rows, transpose_a=True))
        if bias is not None and bias.requires_grad:
            _accumulate(bias, backend.reduce("sum", grad_rows, (0,), False))

    parents = (x, weight) if bias is None else (x, weight, bias)
    return make_result(backend.reshape(y, x.shape[:-1] + (out_features,)), parents, backward)


def gelu(x: Tensor) -> Tensor:
    """GELU with the tanh approximation (torch.nn.functional.gelu(x, approximate="tanh"))."""
    backend = get_backend()
    y, gate = backend.gelu(x.data)  # y = x * gate
    return make_result(y, (x,), lambda grad: _accumulate(x, backend.gelu_backward(x.data, gate, grad)))


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    backend = get_backend()
    y = backend.softmax(x.data, axis)
    return make_result(y, (x,), lambda grad: _accumulate(x, backend.softmax_backward(y, grad, axis)))


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    backend = get_backend()
    y = backend.log_softmax(x.data, axis)
    return make_result(y, (x,), lambda grad: _accumulate(x, backend.log_softmax_backward(y, grad, axis)))


def cross_entropy(logits: Tensor, targets: Any, ignore_index: int = -100) -> Tensor:
    """Mean cross-entropy of logits (..., V) against integer targets (...), skipping targets == ignore_index."""
    backend = get_backend()
    vocab = logits.shape[-1]
    flat_targets = _host_ints(targets).reshape(-1)
    rows = backend.reshape(logits.data, (-1, vocab))  # (N, V)
    if rows.shape[0] != flat_targets.shape[0]:
        raise ValueError(f"cross_entropy: {rows.shape[0]} rows of logits but {flat_targets.shape[0]} targets")
    loss, probs, count = backend.cross_entropy(rows, flat_targets, ignore_index)

    def backward(grad: Array) -> None:
        dlogits = backend.cross_entropy_backward(probs, flat_targets, ignore_index, count, grad)
        _accumulate(logits, backend.reshape(dlogits, logits.shape))

    return make_result(loss, (logits,), backward)


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    """Normalise the last axis to zero mean and unit variance (biased), then scale and shift."""
    backend = get_backend()
    y, normalized, rstd = backend.layer_norm(
        x.data, None if weight is None else weight.data, None if bias is None else bias.data, eps
    )

    def backward(grad: Array) -> None:
        dx, dweight, dbias = backend.layer_norm_backward(
            normalized, rstd, None if weight is None else weight.data, grad, with_bias=bias is not None
        )
        _accumulate(x, dx)
        if weight is not None:
            _accumulate(weight, dweight)
        if bias is not None and dbias is not None:
            _accumulate(bias, dbias)

    parents = tuple(t for t in (x, weight, bias) if t is not None)
    return make_result(y, parents, backward)


def embedding(weight: Tensor, ids: Any) -> Tensor:
    """Rows of weight (V, C) picked by integer ids (...) -> (..., C); repeated ids add up their gradients."""
    backend = get_backend()
    ids = _host_ints(ids)
    num_rows = weight.shape[0]
    return make_result(
        backend.take_rows(weight.data, ids),
        (weight,),
        lambda grad: _accumulate(weight, backend.scatter_add_rows(ids, grad, num_rows)),
    )


def dropout(x: Tensor, p: float, rng: np.random.Generator | None, training: bool = True) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when p == 0 or not training."""
    if not training or p == 0.0:
        return x
    if rng is None:
        raise ValueError("dropout with p > 0 in training needs an np.random.Generator")
    backend = get_backend()
    mask = backend.dropout_mask(x.shape, p, rng, x.dtype)
    return make_result(
        backend.binary("mul", x.data, mask), (x,), lambda grad: _accumulate(x, backend.binary("mul", grad, mask))
    )


def causal_self_attention(
    qkv: Tensor, n_head: int, dropout_p: float = 0.0, rng: np.random.Generator | None = None
) -> Tensor:
    """Fused causal multi-head attention: packed projections qkv (B, T, 3C) -> (B, T, C).

    softmax(q k^T / sqrt(hs) + causal mask) v per head, with dropout on the attention weights when
    dropout_p > 0 (pass dropout_p=0 in eval mode).
    """
    backend = get_backend()
    batch, length, width3 = qkv.shape
    if width3 % (3 * n_head):
        raise ValueError(f"causal_self_attention: last axis {width3} is not 3 * n_head * head_size")
    mask = None
    if dropout_p > 0.0:
        if rng is None:
            raise ValueError("attention dropout with p > 0 needs an np.random.Generator")
        mask = backend.dropout_mask((batch, n_head, length, length), dropout_p, rng, qkv.dtype)
    y, probs = backend.causal_attention(qkv.data, n_head, mask)
    return make_result(
        y,
        (qkv,),
        lambda grad: _accumulate(qkv, backend.causal_attention_backward(qkv.data, probs, n_head, mask, grad)),
    )


def where(condition: Any, a: Any, b: Any) -> Tensor:
    """Elementwise condition ? a : b with broadcasting; the condition (bool) gets no gradient.

    A Tensor condition (e.g. a backend comparison) stays where it is; anything else is a host bool array."""
    backend = get_backend()
    like = a if isinstance(a, Tensor) else b
    if not isinstance(like, Tensor):
        raise TypeError("where needs at least one Tensor among a and b")
    a, b = as_tensor(a, like), as_tensor(b, like)
    cond = condition.data if isinstance(condition, Tensor) else backend.from_numpy(np.asarray(condition, dtype=bool))

    def backward(grad: Array) -> None:
        if a.requires_grad:
            _accumulate(a, unbroadcast(backend.where(cond, grad, 0.0), a.shape))
        if b.requires_grad:
            _accumulate(b, unbroadcast(backend.where(cond, 0.0, grad), b.shape))

    return make_result(backend.where(cond, a.data, b.data), (a, b), backward)


def masked_fill(x: Tensor, mask: Any, value: float) -> Tensor:
    """x with `value` wherever mask (broadcastable bool) is True; those positions get no gradient."""
    return where(mask, value, x)


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    backend = get_backend()
    parts = tuple(tensors)
    axis = axis % parts[0].ndim
    bounds = np.cumsum([0] + [t.shape[axis] for t in parts])

    def backward(grad: Array) -> None:
        for part, start, stop in zip(parts, bounds[:-1], bounds[1:], strict=True):
            if part.requires_grad:
                _accumulate(part, backend.slice_axis(grad, axis, int(start), int(stop)))

    return make_result(backend.concatenate([t.data for t in parts], axis), parts, backward)


def split(x: Tensor, sizes: int | Sequence[int], axis: int = -1) -> tuple[Tensor, ...]:
    """Split along `axis` into pieces of the given sizes (or into `sizes` equal pieces when an int)."""
    axis = axis % x.ndim
    if isinstance(sizes, int):
        if x.shape[axis] % sizes:
            raise ValueError(f"split: axis of size {x.shape[axis]} does not divide into {sizes} pieces")
        sizes = [x.shape[axis] // sizes] * sizes
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"split: sizes {list(sizes)} do not add up to axis size {x.shape[axis]}")
    pieces = []
    start = 0
    for size in sizes:
        key = (slice(None),) * axis + (slice(start, start + size),)
        pieces.append(x[key])
        start += size
    return tuple(pieces)
