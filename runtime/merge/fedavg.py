"""FedAvg: the example-weighted average of the peers' weights, optionally with a server learning rate.

McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized Data".
Stateless: each round's result depends only on that round's results, which makes it the safe
choice when one round covers a large share of the data (see ``runtime.planner``).

The server learning rate (Reddi et al. 2021 call it eta with SGD on the server) scales the round's change:
it is the control for "does a server optimizer win only because it takes a bigger step?".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.merge.base import MergeMethod, checked_number


@dataclass(eq=False)
class FedAvg(MergeMethod):
    """new = sum_i n_i * w_i / sum_i n_i, in float64, returned as float32. No state.

    With ``server_learning_rate`` lr other than 1: new = global + lr * (average - global) (lr > 1 extrapolates
    the round's change, lr < 1 damps it). At exactly 1 the average itself is returned, bit for bit.
    With another aggregator: the average is that aggregator's.
    """

    server_learning_rate: float = 1.0

    name: ClassVar[str] = "fedavg"
    is_stateful: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.server_learning_rate = checked_number(
            self.name, "server_learning_rate", self.server_learning_rate, above=0
        )

    def step(self, global64: np.ndarray, average: np.ndarray) -> np.ndarray:
        if self.server_learning_rate == 1.0:
            return average
        return global64 + self.server_learning_rate * (average - global64)
