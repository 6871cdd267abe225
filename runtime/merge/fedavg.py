"""FedAvg: the example-weighted average of the peers' weights.

McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized Data".
Stateless: each round's result depends only on that round's results, which makes it the safe
choice when one round covers a large share of the data (see ``runtime.planner``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.aggregate import Aggregator
from runtime.merge.base import MergeMethod, Result, check_results, or_mean
from runtime.weights import WeightSpec


@dataclass(eq=False)
class FedAvg(MergeMethod):
    """new = sum_i n_i * w_i / sum_i n_i, in float64, returned as float32. No hyperparameters, no state.

    With another aggregator: new = that aggregator's average.
    """

    name: ClassVar[str] = "fedavg"
    is_stateful: ClassVar[bool] = False

    def merge(
        self,
        global_weights: np.ndarray,
        results: Sequence[Result],
        *,
        spec: WeightSpec | None = None,
        aggregator: Aggregator | None = None,
    ) -> np.ndarray:
        global64, vectors, counts = check_results(global_weights, results, spec)
        return or_mean(aggregator).combine(global64, vectors, counts).astype(np.float32)
