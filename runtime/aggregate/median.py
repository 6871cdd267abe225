"""Median: the coordinate-wise median of the results.

Yin, Chen, Ramchandran and Bartlett 2018, "Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates" (ICML), the median-based gradient descent. Unweighted: every result counts once,
whatever its example count (a count is one more thing a dishonest peer could inflate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.aggregate.base import STACKED_ROW_BYTES, Aggregator, Outliers, stacked


def coordinate_median(matrix: np.ndarray) -> np.ndarray:
    """matrix: (k, n) float64 -> (n,): per coordinate the middle value; for even k the mean of the two middle ones."""
    return np.median(matrix, axis=0)


@dataclass(eq=False)
class Median(Aggregator):
    """The coordinate-wise median. No hyperparameters, no state.

    ``last_outliers`` is always ``()``: the median sets aside all but one or two values in every
    coordinate, so being set aside says nothing about a result.
    """

    name: ClassVar[str] = "median"
    is_stateful: ClassVar[bool] = False
    row_bytes: ClassVar[int] = STACKED_ROW_BYTES

    def _combine(
        self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]
    ) -> tuple[np.ndarray, Outliers]:
        return coordinate_median(stacked(vectors)), ()
