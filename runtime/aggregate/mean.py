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
from runtime.aggregate.streaming import Reread, Stream


@dataclass(eq=False)
class Mean(Aggregator):
    """The example-weighted mean: the global weights plus sum_i n_i (w_i - global) / sum_i n_i, the sum exact and
    the same in any order (``runtime.aggregate.streaming``), so a relay adds each result as it arrives. No
    hyperparameters, no state; names no outliers."""

    name: ClassVar[str] = "mean"
    is_stateful: ClassVar[bool] = False

    def _combine(
        self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]
    ) -> tuple[np.ndarray, Outliers]:
        return self.combine_by_stream(global_weights, vectors, counts)

    def streams(self) -> bool:
        return True

    def open_stream(self, global_weights: np.ndarray) -> Stream:
        return Stream(global_weights, np.zeros_like(global_weights))

    def finish_stream(self, stream: Stream, reread: Reread) -> tuple[np.ndarray, list[object]]:
        mean_update, _ = stream.clipped_mean(None, reread)
        return stream.global_weights + mean_update, []
