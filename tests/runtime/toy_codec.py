"""A toy codec from one file: an update as float16 values, 2 bytes an entry. Importing this module registers it, so
``--codec float16`` (a ``SessionConfig``, a job's ``{"name": "float16"}``) means it in this Python process: native
peers, the simulator and the relay's checks find it through ``runtime.codecs``' registry; a browser would not.

Rounding to the nearest float16 draws no noise, so the same update always gives the same bytes (reproducible) and its
error is not fed back: replays and second copies compare its results bit for bit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.codecs import Codec, CodecError, register
from runtime.codecs.base import checked_update

FLOAT16 = np.dtype("<f2")


@register
@dataclass(frozen=True, kw_only=True)
class Float16Codec(Codec):
    """Every entry as the nearest float16; an entry past float16's range (65504) is refused, not made infinite."""

    name: ClassVar[str] = "float16"

    def payload_bytes(self, size: int) -> int:
        return 2 * size

    def encode(self, update: np.ndarray, seed: int) -> bytes:
        x = checked_update(update)
        if (np.abs(x) > np.finfo(np.float16).max).any():
            raise CodecError("an update entry is past float16's range", "non_finite")
        return x.astype(FLOAT16).tobytes()

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        self.checked_length(payload, size)
        values = np.frombuffer(payload, dtype=FLOAT16, count=size).astype(np.float32)
        if not np.isfinite(values).all():
            raise CodecError("a float16 entry is not finite", "non_finite")
        return values
