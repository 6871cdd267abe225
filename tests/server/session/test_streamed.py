"""``server.session.streamed.add_all``: a merge adds the results its sum lacks with their parts computed in several
threads, to the bits of adding them one by one, and a part the sum cannot hold is refused as it would be alone."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.aggregate import CenteredClipping
from runtime.aggregate.streaming import TermTooLarge
from server.session.streamed import add_all


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_parts_computed_in_threads_give_the_bits_of_adding_one_by_one(workers: int) -> None:
    rng = np.random.default_rng(11)
    n, k = 3000, 13
    global64 = rng.standard_normal(n)
    vectors = [(global64 + rng.standard_normal(n) * 0.2).astype(np.float32) for _ in range(k)]
    counts = [int(c) for c in rng.integers(0, 30, size=k)]
    one, many = CenteredClipping(), CenteredClipping()
    alone, together = one.open_stream(global64), many.open_stream(global64)
    for key in range(k):
        alone.add(key, vectors[key], counts[key])
    read: list[int] = []

    def weights_of(key: object) -> np.ndarray:
        read.append(int(key))  # type: ignore[call-overload]
        return vectors[int(key)]  # type: ignore[call-overload]
    add_all(together, [(key, counts[key]) for key in range(k)], weights_of, workers=workers)
    assert sorted(read) == list(range(k))  # (each read once)
    assert together.total.value().tobytes() == alone.total.value().tobytes()
    assert together.counts == alone.counts and together.distances == alone.distances
    assert list(together.counts) == list(range(k))  # added in the order given
    assert many.finish_stream(together, vectors.__getitem__)[0].tobytes() == \
        one.finish_stream(alone, vectors.__getitem__)[0].tobytes()


def test_a_part_too_large_is_refused_as_it_would_be_alone() -> None:
    global64 = np.zeros(8)
    stream = CenteredClipping().open_stream(global64)
    vectors = [np.full(8, 0.5, np.float32), np.full(8, 3e38, np.float32), np.full(8, 0.25, np.float32)]
    with pytest.raises(TermTooLarge):
        add_all(stream, [(0, 4), (1, 10**9), (2, 4)], vectors.__getitem__, workers=2)
    assert 1 not in stream.counts
