"""Byte-level text for a small language model: a built-in corpus, chunks for peers, and training windows.

The vocabulary is the 256 byte values, so no tokenizer is needed. ``default_corpus`` is the English
help text that ships with every CPython (``pydoc_data.topics``, about 490 kB), so it works offline; Pyodide's
standard library may leave it out, so only the host calls it and peers receive the chunks.

``byte_chunks`` splits the corpus like this: the bytes are cut into blocks of ``block_size`` (1024) bytes; a
seeded random ``validation_fraction`` of the blocks (interleaved through the whole text, so validation
covers every topic rather than only the last ones) is joined in order into the validation array; the
remaining blocks, in order, are cut into ``num_chunks`` contiguous chunks whose sizes differ by at most one
byte. A window may therefore span a seam between two blocks that were not neighbours; that is rare
(one seam per block) and harmless for a loss estimate.
"""

from __future__ import annotations

import numpy as np

BYTE_VOCAB_SIZE = 256


class TextDataError(ValueError):
    """Text data that is too short or settings that cannot be met."""


def default_corpus() -> str:
    """The text of CPython's ``pydoc_data.topics``, topics joined in name order by blank lines."""
    try:
        from pydoc_data.topics import topics
    except ImportError as error:  # Pyodide may ship without pydoc_data
        raise TextDataError("pydoc_data is not available here; build the corpus on the host") from error
    return "\n\n".join(topics[name] for name in sorted(topics))


def byte_chunks(
    text: str | bytes,
    num_chunks: int = 55,
    validation_fraction: float = 0.1,
    seed: int = 0,
    *,
    block_size: int = 1024,
) -> tuple[list[np.ndarray], np.ndarray]:
    """(training chunks, validation bytes), all uint8 arrays; see the module docstring for the split."""
    data = np.frombuffer(text.encode("utf-8") if isinstance(text, str) else bytes(text), dtype=np.uint8)
    if not 0.0 <= validation_fraction < 1.0:
        raise TextDataError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    if block_size < 1:
        raise TextDataError(f"block_size must be positive, got {block_size}")
    n_blocks = -(-len(data) // block_size)
    n_validation = int(round(validation_fraction * n_blocks))
    if validation_fraction > 0 and n_validation == 0:
        n_validation = 1
    if n_validation >= n_blocks:
        raise TextDataError(f"{len(data)} bytes are too few to hold out {validation_fraction:.0%} for validation")
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    is_validation = np.zeros(n_blocks, dtype=bool)
    is_validation[rng.choice(n_blocks, size=n_validation, replace=False)] = True
    blocks = [data[i * block_size : (i + 1) * block_size] for i in range(n_blocks)]
    validation = np.concatenate([b for b, v in zip(blocks, is_validation, strict=True) if v] or [data[:0]])
    train = np.concatenate([b for b, v in zip(blocks, is_validation, strict=True) if not v])
    if not 1 <= num_chunks <= len(train):
        raise TextDataError(f"cannot cut {len(train)} training bytes into {num_chunks} chunks")
    return [chunk.copy() for chunk in np.array_split(train, num_chunks)], validation.copy()


def _windows(data: np.ndarray, context: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    offsets = starts[:, None] + np.arange(context)[None, :]  # (N, T)
    return data[offsets].astype(np.int32), data[offsets + 1].astype(np.int32)


def _check(data: np.ndarray, context: int) -> None:
    if context < 1:
        raise TextDataError(f"context must be positive, got {context}")
    if len(data) < context + 1:
        raise TextDataError(f"{len(data)} bytes are too few for windows of context {context} (need {context + 1})")


def lm_windows(data: np.ndarray, context: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random windows: inputs (n, T) int32 and targets (n, T) int32, the next byte of each input."""
    _check(data, context)
    starts = rng.integers(0, len(data) - context, size=n)
    return _windows(data, context, starts)


def validation_windows(data: np.ndarray, context: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows at evenly spaced starts across ``data``: the same set every time, no generator needed."""
    _check(data, context)
    starts = np.linspace(0, len(data) - context - 1, num=n).round().astype(np.int64)
    return _windows(data, context, starts)
