"""``topk``: per block of ``BLOCK`` entries, only the ``ceil(fraction * n)`` entries of largest magnitude (ties: the
lower index), each as a uint8 offset inside its block and an int8 value on the block's scale (the largest kept
magnitude / 127), stochastically rounded as int8 is.

At a fraction of 3 %: 8 entries of a 256-block in 4 + 8 + 8 = 20 bytes, 51x smaller than float32. What a block
dropped goes into the peer's **error feedback** residual (``runtime.codecs.feedback.ErrorFeedback``) and is sent
with a later update (SparseLoCo; Stich et al. 2018, "Sparsified SGD with memory"). The residual makes a result
depend on the peer's earlier units, so a host replay or a second peer's copy cannot reproduce it: a session whose
results are compared takes int8 instead (``compared_fallback``), and one that asks for topk with replays or copies
is refused (``server.session.rules``).

Payload: the blocks' float32 scales, then every kept entry's uint8 offset, then their int8 values (block by block,
offsets ascending within a block).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Self

import numpy as np

from runtime.codecs.base import (
    BLOCK,
    SCALE_DTYPE,
    Codec,
    CodecError,
    block_count,
    block_lengths,
    block_scales,
    blocked,
    checked_update,
    number,
    read_scales,
    rounding_noise,
    stochastic_round,
    whole_number,
)
from runtime.codecs.registry import register

# topk's share of each block: at 10 % bytetext ended within 1 % of float32 (3 seeds) with 18x fewer bytes each way;
# at 3 % it sent 50x fewer but ended 1.7 % higher (``peertrain bench comm``; BENCHMARKS.md, "Result codecs").
DEFAULT_TOPK_FRACTION = 0.10


@register
@dataclass(frozen=True, kw_only=True)
class TopKCodec(Codec):
    """The largest ``fraction`` of each block, a one-byte offset and an int8 value each, with error feedback."""

    name: ClassVar[str] = "topk"
    needs_error_feedback: ClassVar[bool] = True
    compared_fallback: ClassVar[str] = "int8"  # replays and copies compare its bytes, and it drops nothing

    fraction: float = DEFAULT_TOPK_FRACTION

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.fraction <= 1 or not math.isfinite(self.fraction):
            raise CodecError(f"a topk fraction must be in (0, 1], got {self.fraction}", "bad_codec")

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "fraction": self.fraction}

    @classmethod
    def from_fields(cls, data: Mapping[str, object]) -> Self:
        return cls(block=whole_number(data, "block", BLOCK), fraction=number(data, "fraction", DEFAULT_TOPK_FRACTION))

    def kept(self, size: int) -> np.ndarray:
        """Entries each block keeps: shape (blocks,), at least one."""
        return np.maximum(1, np.ceil(block_lengths(size, self.block) * self.fraction).astype(np.intp))

    def payload_bytes(self, size: int) -> int:
        return 4 * block_count(size, self.block) + 2 * int(self.kept(size).sum())

    def encode(self, update: np.ndarray, seed: int) -> bytes:
        x = checked_update(update)
        blocks = blocked(x, self.block)  # (nb, block), zero-padded
        scales = block_scales(blocks)
        order = self._top_offsets(blocks, x.size)  # one array of offsets per block
        flat_values = np.concatenate([blocks[b, offsets] for b, offsets in enumerate(order)]).astype(np.float32)
        noise = rounding_noise(seed).random(flat_values.size).astype(np.float32)
        q = stochastic_round(flat_values, np.repeat(scales, self.kept(x.size)), noise)
        offsets = np.concatenate(order).astype(np.uint8)
        return scales.astype(SCALE_DTYPE).tobytes() + offsets.tobytes() + q.tobytes()

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        self.checked_length(payload, size)
        nb = block_count(size, self.block)
        scales, rest = read_scales(payload, nb)
        kept = self.kept(size)
        total = int(kept.sum())
        offsets = np.frombuffer(rest, dtype=np.uint8, count=total).astype(np.intp)
        q = np.frombuffer(rest[total:], dtype=np.int8, count=total).astype(np.float32)
        starts = np.repeat(np.arange(nb, dtype=np.intp) * self.block, kept)
        index = starts + offsets
        lengths = np.diff(np.append(np.arange(nb, dtype=np.intp) * self.block, size))
        if (offsets >= np.repeat(lengths, kept)).any():
            raise CodecError("a top-k offset points past the end of its block", "bad_update")
        if np.unique(index).size != total:
            raise CodecError("a top-k block names one entry twice", "bad_update")
        out = np.zeros(size, dtype=np.float32)
        out[index] = q * np.repeat(scales, kept)
        return out

    def _top_offsets(self, blocks: np.ndarray, size: int) -> list[np.ndarray]:
        """Per block, the offsets of its largest magnitudes (ties: lower offset), in ascending offset order."""
        kept, order = self.kept(size), []
        for b, count in enumerate(kept):
            length = min(self.block, size - b * self.block)
            magnitude = np.abs(blocks[b, :length])
            top = np.argsort(-magnitude, kind="stable")[:count]
            order.append(np.sort(top))
        return order
