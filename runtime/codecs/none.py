"""``none``: results travel as the float32 weights themselves, not as an update (old clients; tasks that declare no
codec). It encodes nothing: a peer sends ``runtime.wire``'s weights message, and the session's weights move to the
merged ones as they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.codecs.base import Codec, CodecError
from runtime.codecs.registry import register


@register
@dataclass(frozen=True, kw_only=True)
class NoneCodec(Codec):
    """Float32 weights (4 bytes an entry); a replay or a copy compares the weights themselves."""

    name: ClassVar[str] = "none"
    compresses: ClassVar[bool] = False

    def payload_bytes(self, size: int) -> int:
        return 4 * size

    def encode(self, update: np.ndarray, seed: int) -> bytes:
        raise CodecError("codec 'none' sends weights, not an update", "bad_codec")

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        raise CodecError("codec 'none' sends weights, not an update", "bad_codec")
