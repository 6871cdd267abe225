"""Byte-level text: the built-in corpus, its chunks and validation split, and training windows."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.data.text import (
    TextDataError,
    byte_chunks,
    default_corpus,
    lm_windows,
    validation_windows,
)


@pytest.fixture(scope="module")
def corpus() -> str:
    return default_corpus()


def test_default_corpus_is_english_help_text(corpus: str) -> None:
    assert len(corpus.encode()) > 200_000
    assert "for" in corpus and "while" in corpus and "The " in corpus
    assert default_corpus() == corpus


def test_chunks_and_validation_partition_the_bytes(corpus: str) -> None:
    chunks, validation = byte_chunks(corpus, num_chunks=55, validation_fraction=0.1, seed=0)
    data = corpus.encode()
    assert len(chunks) == 55 and all(c.dtype == np.uint8 for c in chunks) and validation.dtype == np.uint8
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) + len(validation) == len(data)
    assert 0.09 < len(validation) / len(data) < 0.11
    # the validation blocks are interleaved through the text, not only its tail
    blocks = [data[i : i + 1024] for i in range(0, len(data), 1024)]
    held = [i for i, b in enumerate(blocks) if b and b in validation.tobytes()]
    assert min(held) < len(blocks) // 4 and max(held) > 3 * len(blocks) // 4
    train = b"".join(c.tobytes() for c in chunks)
    assert sorted(train + validation.tobytes()) == sorted(data)


def test_split_is_seeded(corpus: str) -> None:
    a_chunks, a_val = byte_chunks(corpus, seed=1)
    b_chunks, b_val = byte_chunks(corpus, seed=1)
    _, c_val = byte_chunks(corpus, seed=2)
    assert a_val.tobytes() == b_val.tobytes() and a_val.tobytes() != c_val.tobytes()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(a_chunks, b_chunks, strict=True))


def test_small_text_and_bad_settings() -> None:
    chunks, validation = byte_chunks(b"abcdefghij" * 10, num_chunks=3, validation_fraction=0.2, block_size=10)
    assert [len(c) for c in chunks] == [27, 27, 26] and len(validation) == 20
    chunks, validation = byte_chunks("hello world", num_chunks=2, validation_fraction=0.0)
    assert len(validation) == 0 and b"".join(c.tobytes() for c in chunks) == b"hello world"
    with pytest.raises(TextDataError, match="too few"):
        byte_chunks("abc", validation_fraction=0.5)
    with pytest.raises(TextDataError, match="chunks"):
        byte_chunks("abc", num_chunks=10, validation_fraction=0.0)


def test_lm_windows_predict_the_next_byte() -> None:
    data = np.frombuffer(bytes(range(200)), dtype=np.uint8)
    inputs, targets = lm_windows(data, context=16, n=32, rng=np.random.default_rng(0))
    assert inputs.shape == targets.shape == (32, 16) and inputs.dtype == targets.dtype == np.int32
    assert np.array_equal(targets[:, :-1], inputs[:, 1:]) and np.all(targets == inputs + 1)
    again, _ = lm_windows(data, context=16, n=32, rng=np.random.default_rng(0))
    assert np.array_equal(inputs, again)
    assert inputs.max() <= 198 and targets.max() <= 199


def test_validation_windows_are_fixed_and_span_the_data() -> None:
    data = np.frombuffer(bytes(range(256)) * 4, dtype=np.uint8)
    inputs, targets = validation_windows(data, context=8, n=10)
    again, _ = validation_windows(data, context=8, n=10)
    assert np.array_equal(inputs, again) and inputs.shape == (10, 8)
    assert inputs[0, 0] == 0 and targets[-1, -1] == data[-1]
    with pytest.raises(TextDataError, match="too few"):
        validation_windows(data[:8], context=8, n=1)
