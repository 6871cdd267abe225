"""Reverse-mode autograd: `Tensor` (tensor.py), its elementwise/shape ops (ops.py) and fused NN ops (functional.py).

All maths runs through the active backend (`runtime.backend`), numpy by default.
"""

from __future__ import annotations

from runtime.autograd import functional
from runtime.autograd.ops import unbroadcast
from runtime.autograd.tensor import (
    Tensor,
    as_tensor,
    default_dtype,
    get_default_dtype,
    is_grad_enabled,
    no_grad,
    tensor,
)

__all__ = [
    "Tensor",
    "as_tensor",
    "default_dtype",
    "functional",
    "get_default_dtype",
    "is_grad_enabled",
    "no_grad",
    "tensor",
    "unbroadcast",
]
