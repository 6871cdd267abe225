"""Local optimizers with torch semantics: SGD (momentum, Nesterov, weight decay), Adam, AdamW, and gradient
clipping by global norm. The update maths runs in the backend's `sgd_momentum_update` / `adam_update` kernels.

Adam: Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization" (bias-corrected, eps outside the sqrt).
AdamW: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization".
Parameters whose `.grad` is None are skipped and their step count does not advance (as in torch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal, overload

import numpy as np

from runtime.autograd import Tensor
from runtime.backend import Array, get_backend


class Optimizer:
    """Holds the parameters (in the given order) and one step count per parameter."""

    buffer_names: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Tensor], *, lr: float) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        if lr < 0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        self.lr = lr
        self.reset()

    def reset(self) -> None:
        """Forget all state (momentum, moments, step counts)."""
        self.steps = [0] * len(self.params)
        self.buffers: dict[str, list[Array | None]] = {name: [None] * len(self.params) for name in self.buffer_names}

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    def step(self) -> None:
        for i, param in enumerate(self.params):
            if param.grad is not None:
                self.steps[i] += 1
                self._update(i, param)

    def _update(self, index: int, param: Tensor) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        """Step counts as "step" (one per parameter) and each state buffer as "<buffer>.<parameter index>"."""
        backend = get_backend()
        state = {"step": np.array(self.steps, dtype=np.int64)}
        for name, values in self.buffers.items():
            for i, value in enumerate(values):
                if value is not None:
                    state[f"{name}.{i}"] = np.array(backend.to_numpy(value), copy=True)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        backend = get_backend()
        steps = np.asarray(state.get("step", ()))
        if steps.shape != (len(self.params),):
            raise ValueError(f"optimizer state 'step' must have shape ({len(self.params)},), got {steps.shape}")
        buffers: dict[str, list[Array | None]] = {name: [None] * len(self.params) for name in self.buffer_names}
        for key, value in state.items():
            if key == "step":
                continue
            name, _, index_text = key.rpartition(".")
            if name not in buffers or not index_text.isdigit() or int(index_text) >= len(self.params):
                raise ValueError(f"unexpected optimizer state key {key!r}")
            param = self.params[int(index_text)]
            if tuple(np.shape(value)) != param.shape:
                raise ValueError(f"optimizer state {key!r} has shape {np.shape(value)}, parameter has {param.shape}")
            buffers[name][int(index_text)] = backend.from_numpy(np.array(value, dtype=param.dtype, copy=True))
        self.steps = [int(s) for s in steps]
        self.buffers = buffers


class SGD(Optimizer):
    """torch.optim.SGD: v = momentum v + (1 - dampening) g; p -= lr (g + momentum v if nesterov else v)."""

    buffer_names = ("momentum_buffer",)

    def __init__(
        self,
        params: Iterable[Tensor],
        *,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening 0")
        self.momentum = momentum
        self.dampening = dampening
        self.nesterov = nesterov
        self.weight_decay = weight_decay
        super().__init__(params, lr=lr)

    def _update(self, index: int, param: Tensor) -> None:
        assert param.grad is not None
        buffers = self.buffers["momentum_buffer"]
        buffers[index] = get_backend().sgd_momentum_update(
            param.data,
            param.grad,
            buffers[index],
            lr=self.lr,
            momentum=self.momentum,
            dampening=self.dampening,
            nesterov=self.nesterov,
            weight_decay=self.weight_decay,
        )


class Adam(Optimizer):
    """torch.optim.Adam; weight_decay adds weight_decay * p to the gradient (L2), unlike AdamW."""

    buffer_names = ("exp_avg", "exp_avg_sq")
    decoupled_weight_decay = False

    def __init__(
        self,
        params: Iterable[Tensor],
        *,
        lr: float = 1e-3,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.eps = eps
        self.weight_decay = weight_decay
        super().__init__(params, lr=lr)

    def _update(self, index: int, param: Tensor) -> None:
        assert param.grad is not None
        backend = get_backend()
        exp_avg, exp_avg_sq = self.buffers["exp_avg"], self.buffers["exp_avg_sq"]
        if exp_avg[index] is None:
            exp_avg[index] = backend.zeros(param.shape, param.dtype)
            exp_avg_sq[index] = backend.zeros(param.shape, param.dtype)
        backend.adam_update(
            param.data,
            param.grad,
            exp_avg[index],
            exp_avg_sq[index],
            step=self.steps[index],
            lr=self.lr,
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            decoupled_weight_decay=self.decoupled_weight_decay,
        )


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay p *= 1 - lr * weight_decay (default 0.01)."""

    decoupled_weight_decay = True

    def __init__(
        self,
        params: Iterable[Tensor],
        *,
        lr: float = 1e-3,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(params, lr=lr, beta_1=beta_1, beta_2=beta_2, eps=eps, weight_decay=weight_decay)


@overload
def clip_grad_norm(params: Iterable[Tensor], max_norm: float, *, on_device: Literal[False] = False) -> float: ...
@overload
def clip_grad_norm(params: Iterable[Tensor], max_norm: float, *, on_device: Literal[True]) -> Array: ...
@overload
def clip_grad_norm(params: Iterable[Tensor], max_norm: float, *, on_device: bool) -> float | Array: ...


def clip_grad_norm(params: Iterable[Tensor], max_norm: float, *, on_device: bool = False) -> float | Array:
    """Scale all gradients by max_norm / (total_norm + 1e-6) when that is below 1 (torch.nn.utils.clip_grad_norm_).

    Returns the total L2 norm of the gradients before clipping. Gradients are replaced, never mutated in place.
    By default the norm is read back once and returned as a float (so the host decides whether to scale).
    With ``on_device=True`` nothing is read back: the norm stays a 0-d backend array (returned) and the scale
    min(1, max_norm / (norm + 1e-6)) is computed on the device and applied to every gradient (a multiply by
    exactly 1 where no clipping is needed), so a GPU step can clip without a host round trip.
    """
    backend = get_backend()
    with_grads = [p for p in params if p.grad is not None]
    if not with_grads:
        return backend.zeros((), np.float32) if on_device else 0.0
    total_squared = backend.squared_norm(with_grads[0].grad)
    for param in with_grads[1:]:
        total_squared = backend.binary("add", total_squared, backend.squared_norm(param.grad))
    if on_device:
        norm = backend.unary("sqrt", total_squared)
        ratio = backend.binary("div", backend.full((), max_norm, norm.dtype), backend.binary("add", norm, 1e-6))
        scale = backend.where(backend.compare("lt", ratio, 1.0), ratio, 1.0)
        for param in with_grads:
            param.grad = backend.binary("mul", param.grad, scale)
        return norm
    total_norm = math.sqrt(float(backend.to_numpy(total_squared)))  # the one read-back
    clip_coefficient = max_norm / (total_norm + 1e-6)
    if clip_coefficient < 1.0:
        for param in with_grads:
            param.grad = backend.binary("mul", param.grad, clip_coefficient)
    return total_norm
