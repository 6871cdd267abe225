"""Fused kernels of the WebGPU backend: gelu, softmax, cross-entropy, layer norm, causal attention, optimizers.

A mixin of `WebGPUBackend` (runtime.backend.webgpu): it uses the backend's elementwise map, matmul, reduce and
views. Row kernels (softmax, layer norm, cross-entropy) run one 64-invocation workgroup per row of a
contiguous (rows, width) array. Attention is composed: two strided batched matmuls over views of the packed
qkv (no copies), a causal scaled softmax kernel between them. Optimizer kernels update in place and bump the
buffer version so cached host copies go stale.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.backend.webgpu_array import GELU_BACKWARD, GELU_GATE, UNARY_CODES, GPUArray
from runtime.backend.webgpu_context import GPUContext, f32_bits

IGNORED = 0xFFFFFFFF  # a target that counts for nothing


def _rows_of(x: GPUArray) -> tuple[int, int]:
    width = x.shape[-1] if x.ndim else 1
    return (x.size // width if width else 0), width


class FusedKernels:
    context: GPUContext

    if TYPE_CHECKING:  # provided by WebGPUBackend
        def _map(self, op: int, shape: tuple[int, ...], operands: list[Any], dtype: Any = None,
                 out: Any = None) -> GPUArray: ...
        def contiguous(self, x: GPUArray) -> GPUArray: ...
        def reduce(self, op: str, x: GPUArray, axes: Any, keepdims: bool) -> GPUArray: ...
        def matmul(self, a: GPUArray, b: GPUArray, transpose_a: bool = ..., transpose_b: bool = ...) -> GPUArray: ...
        def permute(self, x: GPUArray, axes: tuple[int, ...]) -> GPUArray: ...
        def reshape(self, x: GPUArray, shape: tuple[int, ...]) -> GPUArray: ...
        def binary(self, op: str, x: GPUArray, y: Any) -> GPUArray: ...
        def zeros(self, shape: tuple[int, ...], dtype: Any) -> GPUArray: ...

    def _new(self, shape: tuple[int, ...]) -> GPUArray:
        return GPUArray(self.context.buffer(math.prod(shape) * 4), shape)

    def _rows(self, kernel: str, params: list[int], buffers: list[Any], rows: int) -> None:
        if rows:
            self.context.dispatch_linear(kernel, params, buffers, rows, per_group=1)

    # gelu
    def gelu(self, x: GPUArray) -> tuple[GPUArray, GPUArray]:
        gate = self._map(GELU_GATE, x.shape, [x])
        return self.binary("mul", x, gate), gate

    def gelu_backward(self, x: GPUArray, gate: GPUArray, grad: GPUArray) -> GPUArray:
        return self._map(GELU_BACKWARD, x.shape, [x, gate, grad])

    # softmax family (rows along `axis`, moved last when it is not)
    def _last_axis(self, x: GPUArray, axis: int) -> tuple[GPUArray, tuple[int, ...] | None]:
        axis %= x.ndim
        if axis == x.ndim - 1:
            return self.contiguous(x), None
        order = tuple(i for i in range(x.ndim) if i != axis) + (axis,)
        return self.contiguous(self.permute(x, order)), tuple(int(i) for i in np.argsort(order))

    def _softmax_rows(self, x: GPUArray, axis: int, mode: int) -> GPUArray:
        x, inverse = self._last_axis(x, axis)
        rows, width = _rows_of(x)
        out = self._new(x.shape)
        self._rows("softmax", [rows, width, mode, f32_bits(1.0), 1], [out.buffer, x.buffer], rows)
        return out if inverse is None else self.permute(out, inverse)

    def softmax(self, x: GPUArray, axis: int) -> GPUArray:
        return self._softmax_rows(x, axis, 0)

    def log_softmax(self, x: GPUArray, axis: int) -> GPUArray:
        return self._softmax_rows(x, axis, 1)

    def _softmax_backward_rows(self, y: GPUArray, grad: GPUArray, axis: int, mode: int, scale: float = 1.0) -> Any:
        y, inverse = self._last_axis(y, axis)
        grad, _ = self._last_axis(grad, axis)
        rows, width = _rows_of(y)
        out = self._new(y.shape)
        self._rows("softmax_backward", [rows, width, mode, f32_bits(scale)], [out.buffer, y.buffer, grad.buffer],
                   rows)
        return out if inverse is None else self.permute(out, inverse)

    def softmax_backward(self, y: GPUArray, grad: GPUArray, axis: int) -> GPUArray:
        return self._softmax_backward_rows(y, grad, axis, 0)

    def log_softmax_backward(self, y: GPUArray, grad: GPUArray, axis: int) -> GPUArray:
        return self._softmax_backward_rows(y, grad, axis, 1)

    # cross-entropy
    def _targets(self, targets: Any, ignore_index: int) -> tuple[Any, int]:
        targets = np.asarray(targets).reshape(-1)
        valid = targets != ignore_index
        encoded = np.where(valid, targets, 0).astype(np.uint32)
        encoded[~valid] = IGNORED
        return self.context.upload(encoded), int(np.count_nonzero(valid))

    def cross_entropy(self, logits: GPUArray, targets: Any, ignore_index: int) -> tuple[GPUArray, GPUArray, int]:
        logits = self.contiguous(logits)
        rows, width = _rows_of(logits)
        target_buffer, count = self._targets(targets, ignore_index)
        probs, nll = self._new(logits.shape), self._new((rows,))
        self._rows("cross_entropy", [rows, width], [probs.buffer, nll.buffer, logits.buffer, target_buffer], rows)
        loss = self.binary("div", self.reduce("sum", nll, None, False), float(max(count, 1)))
        return loss, probs, count

    def cross_entropy_backward(self, probs: GPUArray, targets: Any, ignore_index: int, count: int,
                               grad: GPUArray) -> GPUArray:
        target_buffer, _ = self._targets(targets, ignore_index)
        grad = self.contiguous(self.reshape(grad, (1,)))
        out = self._new(probs.shape)
        if out.size:
            self.context.dispatch_linear(
                "cross_entropy_backward", [out.size, probs.shape[-1], f32_bits(float(max(count, 1)))],
                [out.buffer, probs.buffer, target_buffer, grad.buffer], out.size)
        return out

    # layer norm
    def layer_norm(self, x: GPUArray, weight: GPUArray | None, bias: GPUArray | None, eps: float) -> Any:
        x = self.contiguous(x)
        rows, width = _rows_of(x)
        y, normalized, rstd = self._new(x.shape), self._new(x.shape), self._new(x.shape[:-1] + (1,))
        w = self.contiguous(weight) if weight is not None else x
        b = self.contiguous(bias) if bias is not None else x
        self._rows("layer_norm", [rows, width, int(weight is not None), int(bias is not None), f32_bits(eps)],
                   [y.buffer, normalized.buffer, rstd.buffer, x.buffer, w.buffer, b.buffer], rows)
        return y, normalized, rstd

    def layer_norm_backward(self, normalized: GPUArray, rstd: GPUArray, weight: GPUArray | None, grad: GPUArray,
                            with_bias: bool = True) -> tuple[GPUArray, GPUArray | None, GPUArray | None]:
        grad = self.contiguous(grad)
        rows, width = _rows_of(normalized)
        leading = tuple(range(normalized.ndim - 1))
        dweight = self.reduce("sum", self.binary("mul", grad, normalized), leading, False) if weight is not None \
            else None
        dbias = self.reduce("sum", grad, leading, False) if with_bias else None
        dx = self._new(normalized.shape)
        w = self.contiguous(weight) if weight is not None else grad
        self._rows("layer_norm_backward", [rows, width, int(weight is not None)],
                   [dx.buffer, normalized.buffer, rstd.buffer, w.buffer, grad.buffer], rows)
        return dx, dweight, dbias

    # causal attention, composed from strided matmuls and a causal softmax kernel
    def _heads(self, qkv: GPUArray, n_head: int) -> tuple[GPUArray, GPUArray, GPUArray, int]:
        """Views q, k, v (B, nh, T, hs) of the packed projections (B, T, 3C); no copies."""
        qkv = self.contiguous(qkv)
        batch, length, width3 = qkv.shape
        head_size = width3 // (3 * n_head)
        strides = (length * width3, head_size, width3, 1)  # (B, nh, T, hs)
        shape = (batch, n_head, length, head_size)
        views = [GPUArray(qkv.buffer, shape, strides=strides, offset=part * width3 // 3) for part in range(3)]
        return views[0], views[1], views[2], head_size

    def causal_attention(self, qkv: GPUArray, n_head: int, dropout_mask: GPUArray | None) -> Any:
        query, key, value, head_size = self._heads(qkv, n_head)
        batch, _, length, _ = query.shape
        scores = self.matmul(query, key, transpose_b=True)  # (B, nh, T, T)
        probs = self._new(scores.shape)
        rows = batch * n_head * length
        self._rows("softmax", [rows, length, 2, f32_bits(1.0 / math.sqrt(head_size)), length],
                   [probs.buffer, scores.buffer], rows)
        attended = self.binary("mul", probs, dropout_mask) if dropout_mask is not None else probs
        y = self.matmul(attended, value)  # (B, nh, T, hs)
        return self.reshape(self.permute(y, (0, 2, 1, 3)), (batch, length, n_head * head_size)), probs

    def causal_attention_backward(self, qkv: GPUArray, probs: GPUArray, n_head: int, dropout_mask: GPUArray | None,
                                  grad: GPUArray) -> GPUArray:
        query, key, value, head_size = self._heads(qkv, n_head)
        batch, _, length, _ = query.shape
        grad_y = self.permute(self.reshape(grad, (batch, length, n_head, head_size)), (0, 2, 1, 3))  # view
        attended = self.binary("mul", probs, dropout_mask) if dropout_mask is not None else probs
        dvalue = self.matmul(attended, grad_y, transpose_a=True)
        dprobs = self.matmul(grad_y, value, transpose_b=True)  # (B, nh, T, T)
        if dropout_mask is not None:
            dprobs = self.binary("mul", dprobs, dropout_mask)
        dscores = self._softmax_backward_rows(probs, dprobs, -1, 0, 1.0 / math.sqrt(head_size))
        dquery = self.matmul(dscores, key)
        dkey = self.matmul(dscores, query, transpose_a=True)
        out = self._new(qkv.shape)
        out_views = self._heads(out, n_head)[:3]
        for view, part in zip(out_views, (dquery, dkey, dvalue), strict=True):
            self._map(UNARY_CODES["copy"], view.shape, [part], out=view)
        return out

    # optimizer kernels (in place)
    def _touch(self, *arrays: GPUArray | None) -> None:
        for x in arrays:
            if x is not None:
                x.buffer.version += 1

    def sgd_momentum_update(self, param: GPUArray, grad: GPUArray, momentum_buffer: GPUArray | None, *, lr: float,
                            momentum: float, dampening: float, nesterov: bool, weight_decay: float) -> Any:
        grad = self.contiguous(grad)
        first = momentum and momentum_buffer is None
        if first:
            momentum_buffer = self._new(param.shape)
        flags = (1 if momentum else 0) | (2 if first else 0) | (4 if nesterov else 0) | (8 if weight_decay else 0)
        params = [param.size, flags, f32_bits(lr), f32_bits(momentum), f32_bits(1.0 - dampening),
                  f32_bits(weight_decay)]
        state = momentum_buffer if momentum_buffer is not None else None
        buffers = [param.buffer, state.buffer if state is not None else self.context.dummy, grad.buffer]
        if param.size:
            self.context.dispatch_linear("sgd", params, buffers, param.size)
        self._touch(param, state)
        return momentum_buffer if momentum else None

    def adam_update(self, param: GPUArray, grad: GPUArray, exp_avg: GPUArray, exp_avg_sq: GPUArray, *, step: int,
                    lr: float, beta_1: float, beta_2: float, eps: float, weight_decay: float,
                    decoupled_weight_decay: bool) -> None:
        grad = self.contiguous(grad)
        decoupled = bool(weight_decay and decoupled_weight_decay)
        l2 = bool(weight_decay and not decoupled_weight_decay)
        bias_correction_1 = 1.0 - beta_1**step
        bias_correction_2 = 1.0 - beta_2**step
        params = [param.size, (1 if decoupled else 0) | (2 if l2 else 0), f32_bits(1.0 - lr * weight_decay),
                  f32_bits(weight_decay), f32_bits(beta_1), f32_bits(1.0 - beta_1), f32_bits(beta_2),
                  f32_bits(1.0 - beta_2), f32_bits(1.0 / math.sqrt(bias_correction_2)), f32_bits(eps),
                  f32_bits(lr / bias_correction_1)]
        if param.size:
            self.context.dispatch_linear("adam", params, [param.buffer, exp_avg.buffer, exp_avg_sq.buffer,
                                                          grad.buffer], param.size)
        self._touch(param, exp_avg, exp_avg_sq)

    def squared_norm(self, x: GPUArray) -> GPUArray:
        return self.reduce("sumsq", x, None, False)

