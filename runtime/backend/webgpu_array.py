"""GPU arrays of the WebGPU backend and the op codes its WGSL kernels switch on.

Shared by `webgpu` (the backend) and `webgpu_fused` (its fused kernels) so neither imports the other.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from runtime.backend.webgpu_context import Buffer

UNARY_CODES = {"neg": 0, "exp": 1, "log": 2, "tanh": 3, "relu": 4, "sqrt": 5, "abs": 6, "sign": 7, "step": 8,
               "copy": 9}
BINARY_CODES = {"add": 10, "sub": 11, "mul": 12, "div": 13, "pow": 14, "maximum": 15}
COMPARE_CODES = {"eq": 20, "gt": 21, "ge": 22, "lt": 23, "le": 24, "ne": 25}
WHERE, GELU_GATE, GELU_BACKWARD = 30, 40, 41
REDUCE_CODES = {"sum": 0, "max": 1, "sumsq": 2}
FLOAT32 = np.dtype(np.float32)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class GPUArray:
    """A view (shape, element strides, element offset) of a GPU buffer, with a logical numpy dtype."""

    __slots__ = ("buffer", "shape", "strides", "offset", "dtype", "host", "host_version")

    def __init__(self, buffer: Buffer, shape: tuple[int, ...], dtype: Any = FLOAT32,
                 strides: tuple[int, ...] | None = None, offset: int = 0) -> None:
        self.buffer = buffer
        self.shape = tuple(int(n) for n in shape)
        self.strides = contiguous_strides(self.shape) if strides is None else tuple(strides)
        self.offset = offset
        self.dtype = np.dtype(dtype)
        self.host: np.ndarray | None = None  # a cached read-back, valid while buffer.version == host_version
        self.host_version = -1

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        expected = contiguous_strides(self.shape)
        return self.offset == 0 and all(n == 1 or s == e for n, s, e in zip(self.shape, self.strides, expected,
                                                                              strict=True))

    def __repr__(self) -> str:
        return f"GPUArray(shape={self.shape}, dtype={self.dtype})"
