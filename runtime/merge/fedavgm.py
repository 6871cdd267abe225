"""FedAvgM: FedAvg plus server momentum.

Hsu, Qi and Brown 2019, "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification". The round's change ``global - average`` is treated as one gradient step
(the pseudo-gradient) and continued with heavy-ball momentum on the server. That suits many small
rounds; when one round is a whole pass over the data, momentum keeps growing an already large step
(an arithmetic model trained on a single-chunk package diverges this way), hence the planner's guard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from runtime.merge.base import (
    MergeMethod,
    StateDict,
    StateMismatch,
    StateValue,
    checked_flag,
    checked_number,
    checked_round_count,
    checked_state_array,
)


def fedavgm_update(
    global_weights: np.ndarray,
    average: np.ndarray,
    momentum: np.ndarray,
    *,
    server_learning_rate: float,
    server_momentum: float,
    nesterov: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """One server step in float64; returns (new global weights, new momentum buffer).

    pseudo_gradient = global - average
    momentum        = server_momentum * momentum + pseudo_gradient      (momentum starts at 0)
    new             = global - server_learning_rate * momentum
    Nesterov:  new  = global - server_learning_rate * (server_momentum * momentum + pseudo_gradient)
    """
    pseudo_gradient = global_weights - average
    momentum = server_momentum * momentum + pseudo_gradient
    direction = server_momentum * momentum + pseudo_gradient if nesterov else momentum
    return global_weights - server_learning_rate * direction, momentum


@dataclass(eq=False)
class FedAvgM(MergeMethod):
    """Server momentum on the pseudo-gradient (Hsu et al. 2019). Defaults: learning rate 1.0, momentum 0.9.

    With ``server_momentum=0`` and ``server_learning_rate=1`` it is exactly FedAvg.
    State: ``t`` (merges done) and ``momentum`` (float64 vector, absent before the first merge).
    """

    server_learning_rate: float = 1.0
    server_momentum: float = 0.9
    nesterov: bool = False
    momentum: np.ndarray | None = field(default=None, init=False, repr=False)
    t: int = field(default=0, init=False)

    name: ClassVar[str] = "fedavgm"
    is_stateful: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.server_learning_rate = checked_number(
            self.name, "server_learning_rate", self.server_learning_rate, above=0
        )
        self.server_momentum = checked_number(self.name, "server_momentum", self.server_momentum, at_least=0, below=1)
        self.nesterov = checked_flag(self.name, "nesterov", self.nesterov)

    def check_state(self, global64: np.ndarray) -> None:
        if self.momentum is not None and self.momentum.shape != global64.shape:
            raise StateMismatch(f"fedavgm momentum has {self.momentum.shape[0]} values, weights have "
                                f"{global64.shape[0]}")

    def step(self, global64: np.ndarray, average: np.ndarray) -> np.ndarray:
        momentum = np.zeros_like(global64) if self.momentum is None else self.momentum
        new_weights, self.momentum = fedavgm_update(
            global64,
            average,
            momentum,
            server_learning_rate=self.server_learning_rate,
            server_momentum=self.server_momentum,
            nesterov=self.nesterov,
        )
        self.t += 1
        return new_weights

    def state_dict(self) -> StateDict:
        state: StateDict = {"t": self.t}
        if self.momentum is not None:
            state["momentum"] = self.momentum.copy()
        return state

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        unknown = sorted(set(state) - {"t", "momentum"})
        if unknown or "t" not in state:
            raise StateMismatch(f"fedavgm state needs 't' and optionally 'momentum', got keys {sorted(state)}")
        t = checked_round_count(self.name, state["t"])
        momentum = checked_state_array(self.name, "momentum", state["momentum"]) if "momentum" in state else None
        if (momentum is None) != (t == 0):
            raise StateMismatch(f"fedavgm state has t={t} but {'no' if momentum is None else 'a'} momentum vector")
        self.t, self.momentum = t, momentum

    def reset(self) -> None:
        self.t, self.momentum = 0, None
