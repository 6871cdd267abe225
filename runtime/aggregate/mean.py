"""Mean: the example-weighted mean of the results, FedAvg's average.

McMahan, Moore, Ramage, Hampson and Agüera y Arcas 2017, "Communication-Efficient Learning of Deep
Networks from Decentralized Data" (AISTATS). The default aggregator of every merge method.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.aggregate.base import Aggregator, Outliers


def weighted_average(vectors: Sequence[np.ndarray], counts: Sequence[int]) -> np.ndarray:
    """sum_i n_i * w_i / sum_i n_i, accumulated in float64 (McMahan et al. 2017's FedAvg).

    vectors: k vectors of shape (n,); counts: k example counts; returns shape (n,), float64.
    """
    total = np.zeros(vectors[0].shape[0], dtype=np.float64)
    for vector, count in zip(vectors, counts, strict=True):
        total += count * vector.astype(np.float64)
    return total / sum(counts)


@dataclass(eq=False)
class Mean(Aggregator):
    """The example-weighted mean, in float64. No hyperparameters, no state; names no outliers."""

    name: ClassVar[str] = "mean"
    is_stateful: ClassVar[bool] = False

    def _combine(
        self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]
    ) -> tuple[np.ndarray, Outliers]:
        return weighted_average(vectors, counts), ()
