"""Trimmed mean: per coordinate, drop the largest and smallest values and average the rest.

Yin, Chen, Ramchandran and Bartlett 2018, "Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates" (ICML), the trimmed-mean-based gradient descent with trim fraction beta. Unweighted:
every result counts once, whatever its example count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.aggregate.base import STACKED_ROW_BYTES, Aggregator, Outliers, stacked
from runtime.aggregate.checks import TooFewResults, checked_number

# fraction * k is computed in floating point: 0.29 * 100 gives 28.999999999999996, which must trim 29
TRIM_TOLERANCE = 1e-9


def trim_count(fraction: float, k: int) -> int:
    """How many values to drop at each end of a coordinate: floor(fraction * k), guarded against float error."""
    return math.floor(fraction * k + TRIM_TOLERANCE)


def trimmed_mean(matrix: np.ndarray, trim: int) -> tuple[np.ndarray, np.ndarray]:
    """matrix: (k, n) float64, 2 * trim < k -> (mean of the kept values (n,), how often each result was dropped (k,)).

    order  = per column, the rows sorted by value (k, n); ties keep the lower row first
    kept   = the sorted values at ranks trim .. k - trim - 1 (k - 2 * trim, n)
    mean   = kept summed over the rows / (k - 2 * trim)
    drops  = per row, the number of columns where it ranks below trim or at k - trim or above
    """
    k = matrix.shape[0]
    order = np.argsort(matrix, axis=0, kind="stable")
    kept = np.take_along_axis(matrix, order[trim : k - trim], axis=0)
    dropped = np.concatenate([order[:trim], order[k - trim :]]).ravel()
    return kept.sum(axis=0) / (k - 2 * trim), np.bincount(dropped, minlength=k)


@dataclass(eq=False)
class TrimmedMean(Aggregator):
    """Drop floor(fraction * k) values at each end of every coordinate, average the rest. Default fraction 0.2.

    With the default and k = 5 one value goes at each end; fraction 0 is the unweighted mean.
    ``last_outliers``: the results dropped in more than half of the coordinates. No state.
    """

    fraction: float = 0.2

    name: ClassVar[str] = "trimmed_mean"
    is_stateful: ClassVar[bool] = False
    row_bytes: ClassVar[int] = STACKED_ROW_BYTES

    def __post_init__(self) -> None:
        self.fraction = checked_number(self.name, "fraction", self.fraction, at_least=0, below=0.5)

    def _combine(
        self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]
    ) -> tuple[np.ndarray, Outliers]:
        k = len(vectors)
        trim = trim_count(self.fraction, k)
        if k - 2 * trim < 1:
            raise TooFewResults(f"trimmed_mean with fraction {self.fraction} drops {trim} of {k} values at each end")
        mean, drops = trimmed_mean(stacked(vectors), trim)
        coordinates = global_weights.shape[0]
        return mean, tuple(int(i) for i in np.flatnonzero(2 * drops > coordinates))
