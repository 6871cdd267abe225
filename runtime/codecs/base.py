"""What every update codec is: the ``Codec`` interface, its error, and the block maths the block codecs share.

A unit's *update* is its new weights minus the weights it was handed (DiLoCo's pseudo-gradient of one unit). A codec
turns an update into bytes (``encode``) and back (``decode``); the session's codec also moves the global weights by
decoded merged steps (``runtime.deltas``). Each codec is one file of this package, found by its name through the
registry (``runtime.codecs.registry``), and says what the relay and the peers need to know about it as properties:
whether it compresses at all, whether its bytes can be compared between a result and a replay or a second copy, and
whether a peer keeps an error-feedback residual for it. Nothing outside a codec's file asks for its name.

The block codecs (int8, topk) cut an update into blocks of ``BLOCK`` entries and keep, per block, one float32 scale.
Why blocks of 256: a scale per block adds 4 bytes per 256 (1.6 %), and an outlier entry coarsens only its own 256
neighbours' resolution (one scale for a whole tensor lets a single large entry zero out the rest); 256 is also the
most a uint8 offset can address, so top-k indices cost one byte each. Every operation here is IEEE float32 or float64
arithmetic, comparisons and a seeded PCG64 stream, which numpy computes identically in CPython and Pyodide.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Self

import numpy as np

BLOCK = 256
SCALE_DTYPE = np.dtype("<f4")
_NOISE_STREAM = 0x51C0DEC  # the seed stream of the stochastic rounding (a unit's seed picks the draw within it)


class CodecError(ValueError):
    """An update payload that does not decode: ``code`` names the check (the relay answers 4xx with it)."""

    code = "bad_update"
    http_status = 422

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


@dataclass(frozen=True, kw_only=True)
class Codec(ABC):
    """A codec and its settings. A subclass is a frozen dataclass of its own settings (``block`` is every codec's),
    declares the class attributes below, implements ``payload_bytes``, ``encode`` and ``decode``, and is registered
    under its ``name`` (``runtime.codecs.registry.register``). Its JSON is ``{"name", "block", ...its settings}``."""

    name: ClassVar[str]
    # False: results travel as float32 weights, not as an update (the ``none`` codec); no steps, no chains.
    compresses: ClassVar[bool] = True
    # True: ``encode`` is a function of (update, seed) alone, in a browser and natively (same bytes every time).
    reproducible: ClassVar[bool] = True
    # True: the codec drops part of each update, and a peer (and the relay's steps) adds what it dropped to the next
    # update before encoding (``runtime.codecs.feedback.ErrorFeedback``); the residual lives in the peer's memory.
    needs_error_feedback: ClassVar[bool] = False
    # The codec ``--codec auto`` takes instead of this one where replays or copies compare results and this one is
    # not ``comparable`` (float32 weights always compare).
    compared_fallback: ClassVar[str] = "none"

    block: int = BLOCK

    def __post_init__(self) -> None:
        if isinstance(self.block, bool) or not isinstance(self.block, int) or not 1 <= self.block <= 256:
            raise CodecError(f"a block holds 1 to 256 entries (a uint8 offset), got {self.block}", "bad_codec")

    @property
    def comparable(self) -> bool:
        """Whether a host replay or a second peer's copy of a unit gives this result's bytes exactly, so results can be
        compared bit for bit: reproducible, and carrying nothing from the peer's earlier units."""
        return self.reproducible and not self.needs_error_feedback

    @property
    def why_not_comparable(self) -> str:
        """Why replays and copies cannot judge this codec's results, as the words after its name in a refusal."""
        if self.needs_error_feedback:
            return "sends what earlier units dropped along with each update (error feedback)"
        if not self.reproducible:
            return "encodes one update to different bytes each time"
        return "is comparable"

    # -- JSON ------------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "block": self.block}

    @classmethod
    def from_fields(cls, data: Mapping[str, object]) -> Self:
        """This codec from its JSON object (the registry's ``from_json`` picked the class by ``name``); a subclass
        with settings of its own reads them and calls ``cls(...)``. Keys it does not take are ignored."""
        return cls(block=whole_number(data, "block", BLOCK))

    # -- the payload -----------------------------------------------------------------------------------------
    @abstractmethod
    def payload_bytes(self, size: int) -> int:
        """Bytes of an encoded update of ``size`` entries."""

    @abstractmethod
    def encode(self, update: np.ndarray, seed: int) -> bytes:
        """The payload of ``update`` (float32, finite); deterministic in (update, seed) where ``reproducible``."""

    @abstractmethod
    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        """The float32 update a payload stands for (``size`` entries); a malformed payload raises ``CodecError``."""

    def checked_length(self, payload: bytes | memoryview, size: int) -> None:
        """A ``length_mismatch`` ``CodecError`` unless ``payload`` has this codec's bytes for ``size`` entries."""
        expected = self.payload_bytes(size)
        if len(payload) != expected:
            raise CodecError(f"a {self.name} update of {size} entries is {expected} bytes, got {len(payload)}",
                             "length_mismatch")


def whole_number(data: Mapping[str, object], key: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodecError(f"a codec's {key} is a whole number, got {data!r}", "bad_codec")
    return value


def number(data: Mapping[str, object], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CodecError(f"a codec's {key} is a number, got {data!r}", "bad_codec")
    return float(value)


# -- the block codecs' shared maths ---------------------------------------------------------------------------

def checked_update(update: np.ndarray) -> np.ndarray:
    """``update`` as a float32 vector, or a ``non_finite`` ``CodecError``."""
    x = np.asarray(update, dtype=np.float32)
    if x.ndim != 1 or not np.isfinite(x).all():
        raise CodecError("an update must be a finite float32 vector", "non_finite")
    return x


def block_count(size: int, block: int) -> int:
    return -(-size // block)


def block_lengths(size: int, block: int) -> np.ndarray:
    """Entries in each block (the last one may be short): shape (blocks,), intp (int32 in Pyodide)."""
    lengths = np.full(block_count(size, block), block, dtype=np.intp)
    if size % block:
        lengths[-1] = size % block
    return lengths


def blocked(x: np.ndarray, block: int) -> np.ndarray:
    """``x`` zero-padded to whole blocks: shape (blocks, block)."""
    padded = np.zeros(block_count(x.size, block) * block, dtype=np.float32)
    padded[:x.size] = x
    return padded.reshape(-1, block)


def block_scales(blocks: np.ndarray) -> np.ndarray:
    """Per block, its largest magnitude (top-k always keeps it) over 127, in float32: shape (blocks,)."""
    return np.abs(blocks).max(axis=1).astype(np.float32) / np.float32(127)


def rounding_noise(seed: int) -> np.random.Generator:
    """The generator of a unit's stochastic rounding: the same seed draws the same noise in a browser and natively."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, _NOISE_STREAM]))


def stochastic_round(x: np.ndarray, scale: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """``floor(x / scale + noise)`` clipped to int8, ``noise`` uniform in [0, 1): the rounding error has mean zero
    (a zero scale gives zeros)."""
    safe = np.where(scale > 0, scale, np.float32(1))
    q = np.floor(x / safe + noise)
    return np.clip(np.where(scale > 0, q, 0), -127, 127).astype(np.int8)


def read_scales(payload: bytes | memoryview, blocks: int) -> tuple[np.ndarray, memoryview]:
    """(the payload's leading ``blocks`` float32 scales, the bytes after them); a negative or non-finite scale is a
    ``non_finite`` ``CodecError``."""
    scales = np.frombuffer(payload, dtype=SCALE_DTYPE, count=blocks).astype(np.float32)
    if not np.isfinite(scales).all() or (scales < 0).any():
        raise CodecError("a block scale is negative or not finite", "non_finite")
    return scales, memoryview(payload)[4 * blocks:]
