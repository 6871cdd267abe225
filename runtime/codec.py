"""Update codecs: how a peer's change to the weights travels, smaller than float32 weights.

A unit's *update* is its new weights minus the weights it was handed (DiLoCo's pseudo-gradient of one unit). The
codecs cut it into blocks of ``BLOCK`` entries and keep, per block, one float32 scale:

``none``
    the float32 weights themselves (today's results; kept for old clients).
``int8``
    every entry as an int8 ``q`` with ``x ~= q * scale``, ``scale = max|x| / 127`` over the block. Rounding is
    stochastic (``floor(x / scale + u)``, ``u`` uniform in [0, 1)) so the quantization error has mean zero, and
    ``u`` comes from a generator seeded with the unit's seed: the same update always gives the same bytes, in a
    browser and natively, so a host replay and a second peer's copy compare encoded results.
    4 + BLOCK bytes per block instead of 4 * BLOCK: 3.94x smaller at BLOCK = 256.
``topk``
    per block, the ``ceil(fraction * n)`` entries of largest magnitude (ties: the lower index), each as a uint8
    offset inside its block and an int8 value on the block's scale (the largest kept magnitude / 127). At a
    fraction of 3 %: 8 entries of a 256-block in 4 + 8 + 8 = 20 bytes, 51x smaller than float32. What a block
    dropped goes into the peer's **error feedback** residual (``ErrorFeedback``) and is sent with a later update
    (SparseLoCo; Stich et al. 2018, "Sparsified SGD with memory").

Why blocks of 256: a scale per block adds 4 bytes per 256 (1.6 %), and an outlier entry coarsens only its own
256 neighbours' resolution (one scale for a whole tensor lets a single large entry zero out the rest); 256 is also
the most a uint8 offset can address, so top-k indices cost one byte each. Every operation here is IEEE float32 or
float64 arithmetic, comparisons and a seeded PCG64 stream, which numpy computes identically in CPython and Pyodide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BLOCK = 256
CODECS = ("none", "int8", "topk")
# topk's share of each block: at 10 % bytetext ended within 1 % of float32 (3 seeds) with 18x fewer bytes each way;
# at 3 % it sent 50x fewer but ended 1.7 % higher (``peertrain bench comm``; BENCHMARKS.md, "Result codecs").
DEFAULT_TOPK_FRACTION = 0.10
SCALE_DTYPE = np.dtype("<f4")


class CodecError(ValueError):
    """An update payload that does not decode: ``code`` names the check (the relay answers 4xx with it)."""

    code = "bad_update"
    http_status = 422

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


@dataclass(frozen=True)
class Codec:
    """A codec and its settings (``name`` in ``CODECS``; ``fraction`` for topk)."""

    name: str = "none"
    fraction: float = DEFAULT_TOPK_FRACTION
    block: int = BLOCK

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise CodecError(f"unknown codec {self.name!r}; choose one of {', '.join(CODECS)}", "bad_codec")
        if not 0 < self.fraction <= 1 or not math.isfinite(self.fraction):
            raise CodecError(f"a topk fraction must be in (0, 1], got {self.fraction}", "bad_codec")
        if not 1 <= self.block <= 256:
            raise CodecError(f"a block holds 1 to 256 entries (a uint8 offset), got {self.block}", "bad_codec")

    @property
    def compresses(self) -> bool:
        return self.name != "none"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "block": self.block, **({"fraction": self.fraction} if self.name == "topk" else {})}

    @classmethod
    def from_json(cls, data: object) -> Codec:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise CodecError(f"a codec is an object with a name, got {data!r}", "bad_codec")
        fraction, block = data.get("fraction", DEFAULT_TOPK_FRACTION), data.get("block", BLOCK)
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or isinstance(block, bool) or \
                not isinstance(block, int):
            raise CodecError(f"a codec's fraction is a number and its block a whole number, got {data!r}", "bad_codec")
        return cls(data["name"], float(fraction), block)

    # -- sizes ------------------------------------------------------------------------------------------
    def blocks(self, size: int) -> int:
        return -(-size // self.block)

    def kept(self, size: int) -> np.ndarray:
        """Entries each block keeps (topk), or every entry (int8): shape (blocks,)."""
        lengths = np.full(self.blocks(size), self.block, dtype=np.intp)
        if size % self.block:
            lengths[-1] = size % self.block
        if self.name == "topk":
            return np.maximum(1, np.ceil(lengths * self.fraction).astype(np.intp))  # (intp: int32 in Pyodide)
        return lengths

    def payload_bytes(self, size: int) -> int:
        """Bytes of an encoded update of ``size`` entries."""
        if self.name == "none":
            return 4 * size
        kept = int(self.kept(size).sum())
        return 4 * self.blocks(size) + kept * (2 if self.name == "topk" else 1)

    # -- encoding ---------------------------------------------------------------------------------------
    def encode(self, update: np.ndarray, seed: int) -> bytes:
        """The payload of ``update`` (float32, finite). Deterministic in (update, seed)."""
        x = np.asarray(update, dtype=np.float32)
        if self.name == "none":
            raise CodecError("codec 'none' sends weights, not an update", "bad_codec")
        if x.ndim != 1 or not np.isfinite(x).all():
            raise CodecError("an update must be a finite float32 vector", "non_finite")
        blocks = self._blocked(x)  # (nb, block), zero-padded
        # the scale: the block's largest magnitude (top-k always keeps it) over 127, in float32
        scales = np.abs(blocks).max(axis=1).astype(np.float32) / np.float32(127)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, 0x51C0DEC]))
        if self.name == "int8":
            noise = rng.random(x.size).astype(np.float32)
            q = _round(x, np.repeat(scales, self.block)[:x.size], noise)
            return scales.astype(SCALE_DTYPE).tobytes() + q.tobytes()
        order = self._top_offsets(blocks, x.size)  # one array of offsets per block
        flat_values = np.concatenate([blocks[b, offsets] for b, offsets in enumerate(order)]).astype(np.float32)
        noise = rng.random(flat_values.size).astype(np.float32)
        q = _round(flat_values, np.repeat(scales, self.kept(x.size)), noise)
        offsets = np.concatenate(order).astype(np.uint8)
        return scales.astype(SCALE_DTYPE).tobytes() + offsets.tobytes() + q.tobytes()

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        """The float32 update a payload stands for (``size`` entries); a malformed payload raises ``CodecError``."""
        if self.name == "none":
            raise CodecError("codec 'none' sends weights, not an update", "bad_codec")
        expected = self.payload_bytes(size)
        if len(payload) != expected:
            raise CodecError(f"a {self.name} update of {size} entries is {expected} bytes, got {len(payload)}",
                             "length_mismatch")
        nb = self.blocks(size)
        scales = np.frombuffer(payload, dtype=SCALE_DTYPE, count=nb).astype(np.float32)
        if not np.isfinite(scales).all() or (scales < 0).any():
            raise CodecError("a block scale is negative or not finite", "non_finite")
        rest = memoryview(payload)[4 * nb:]
        if self.name == "int8":
            q = np.frombuffer(rest, dtype=np.int8, count=size).astype(np.float32)
            return q * np.repeat(scales, self.block)[:size]
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

    def _blocked(self, x: np.ndarray) -> np.ndarray:
        padded = np.zeros(self.blocks(x.size) * self.block, dtype=np.float32)
        padded[:x.size] = x
        return padded.reshape(-1, self.block)

    def _top_offsets(self, blocks: np.ndarray, size: int) -> list[np.ndarray]:
        """Per block, the offsets of its largest magnitudes (ties: lower offset), in ascending offset order."""
        kept, order = self.kept(size), []
        for b, count in enumerate(kept):
            length = min(self.block, size - b * self.block)
            magnitude = np.abs(blocks[b, :length])
            top = np.argsort(-magnitude, kind="stable")[:count]
            order.append(np.sort(top))
        return order


def _round(x: np.ndarray, scale: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Stochastic rounding of ``x / scale`` to int8 (a zero scale gives zeros)."""
    safe = np.where(scale > 0, scale, np.float32(1))
    q = np.floor(x / safe + noise)
    return np.clip(np.where(scale > 0, q, 0), -127, 127).astype(np.int8)


class ErrorFeedback:
    """A peer's residual: what its codec dropped so far, added to its next update before encoding (kept in the
    worker's memory; a page also keeps it in IndexedDB across reloads). ``None`` codecs and int8 keep none:
    int8's error has mean zero by its stochastic rounding, and only top-k drops whole entries."""

    def __init__(self, size: int) -> None:
        self.residual = np.zeros(size, dtype=np.float32)

    def encode(self, codec: Codec, update: np.ndarray, seed: int) -> tuple[bytes, np.ndarray]:
        """The payload of ``update`` plus the residual, and what it decodes to; the residual keeps the rest."""
        corrected = (np.asarray(update, dtype=np.float32) + self.residual) if codec.name == "topk" else update
        payload = codec.encode(corrected, seed)
        decoded = codec.decode(payload, int(np.asarray(update).size))
        if codec.name == "topk":
            self.residual = (corrected - decoded).astype(np.float32)
        return payload, decoded


def arrived(codec: Codec, base: np.ndarray, weights: np.ndarray, seed: int, feedback: ErrorFeedback) -> np.ndarray:
    """The weights a result trained to ``weights`` from ``base`` stands for once it reached the relay in ``codec``:
    what ``runtime.peer.Peer`` sends and the relay adds back (``runtime.wire.result_weights``), bit for bit."""
    base = np.asarray(base, dtype=np.float32)
    _, decoded = feedback.encode(codec, (np.asarray(weights, dtype=np.float32) - base).astype(np.float32), seed)
    return (base + decoded).astype(np.float32)
