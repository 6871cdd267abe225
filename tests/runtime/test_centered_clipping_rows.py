"""Centered clipping row by row (``runtime.aggregate.centered_clipping.Updates``) against the (k, n) float64 matrix
form it replaced, written out here as the oracle: the same bits, for any shape, over rounds of history, with more
than one iteration; with one (the default), which sums exactly as results arrive (``runtime.aggregate.streaming``),
the oracle's values to float64 rounding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from runtime.aggregate import CenteredClipping


def matrix_centered_clipping(global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int],
                             center: np.ndarray, iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """The (k, n) float64 matrix form the aggregator used before it went row by row (the oracle): the same
    arithmetic on the whole matrix at once."""
    updates = np.stack([np.asarray(v, dtype=np.float64) for v in vectors]) - global_weights
    radius = 2.0 * float(np.median(np.sqrt(np.square(updates - center).sum(axis=1))))
    weights = np.asarray(counts, dtype=np.float64)
    share = weights / weights.sum()
    v = center
    for _ in range(iterations):
        z = updates - v
        norms = np.sqrt(np.square(z).sum(axis=1))
        scale = np.ones_like(norms)
        scale[norms > radius] = radius / norms[norms > radius]
        v = v + ((share * scale)[:, None] * z).sum(axis=0)
    return global_weights + v, v


@pytest.mark.parametrize(("k", "n", "iterations"), [(1, 1, 1), (3, 2, 1), (7, 5, 2), (40, 1000, 1), (11, 65_537, 3)])
def test_centered_clipping_row_by_row_gives_the_matrix_forms_bits(k: int, n: int, iterations: int) -> None:
    rng = np.random.default_rng(k * n)
    global_weights = rng.standard_normal(n).astype(np.float32)
    vectors = [global_weights + rng.standard_normal(n).astype(np.float32) * rng.uniform(0.01, 3) for _ in range(k)]
    vectors[0] = vectors[0] * 50  # (one far away: clipped)
    counts = [int(c) for c in rng.integers(1, 100, size=k)]
    clipping = CenteredClipping(iterations=iterations)
    center = np.zeros(n)
    for _ in range(2):  # (the second round starts from the first's aggregate: the history)
        average = clipping.combine(global_weights.astype(np.float64), vectors, counts)
        expected, expected_center = matrix_centered_clipping(global_weights.astype(np.float64), vectors, counts,
                                                             center, iterations)
        if iterations > 1:
            assert average.tobytes() == expected.tobytes()
            assert clipping.state_dict()["center"].tobytes() == expected_center.tobytes()
        else:
            np.testing.assert_allclose(average, expected, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(clipping.state_dict()["center"], expected_center, rtol=1e-12, atol=1e-12)
            expected_center = clipping.state_dict()["center"]  # (the history the aggregator goes on from)
        center = expected_center
