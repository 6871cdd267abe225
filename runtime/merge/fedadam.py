"""FedAdam: Adam on the server, fed with the round's pseudo-gradient.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan 2021, "Adaptive Federated
Optimization" (ICLR), Algorithm 2. The round's change ``average - global`` is the pseudo-gradient
(``delta``); the server keeps Adam's first and second moments of it. Note the step uses the first
moment ``m``, not ``delta``: Flower's FedAdam once used ``delta`` there (flower#893).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from runtime.aggregate import Aggregator
from runtime.merge.base import (
    MergeMethod,
    Result,
    StateDict,
    StateMismatch,
    StateValue,
    check_results,
    checked_flag,
    checked_number,
    checked_round_count,
    checked_state_array,
    or_mean,
)
from runtime.weights import WeightSpec


def fedadam_update(
    global_weights: np.ndarray,
    average: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    t: int,
    *,
    eta: float,
    beta_1: float,
    beta_2: float,
    tau: float,
    bias_correction: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Server step number ``t`` (1-based) in float64; returns (new global weights, m, v).

    delta = average - global
    m     = beta_1 * m + (1 - beta_1) * delta              (m and v start at 0)
    v     = beta_2 * v + (1 - beta_2) * delta**2
    m_hat = m / (1 - beta_1**t), v_hat = v / (1 - beta_2**t) with bias correction, else m_hat = m, v_hat = v
    new   = global + eta * m_hat / (sqrt(v_hat) + tau)
    """
    delta = average - global_weights
    m = beta_1 * m + (1.0 - beta_1) * delta
    v = beta_2 * v + (1.0 - beta_2) * delta * delta
    m_hat, v_hat = (m / (1.0 - beta_1**t), v / (1.0 - beta_2**t)) if bias_correction else (m, v)
    return global_weights + eta * m_hat / (np.sqrt(v_hat) + tau), m, v


@dataclass(eq=False)
class FedAdam(MergeMethod):
    """Adam on the server (Reddi et al. 2021). Defaults: eta 0.01, beta_1 0.9, beta_2 0.99, tau 1e-3.

    Bias correction is ON by default (``bias_correction=True``); ``False`` gives the paper's
    Algorithm 2, which has none. Why: both moments start at zero, so without correction they
    are shrunk by (1 - beta_1**t) and (1 - beta_2**t), and the two shrinkages do not cancel: with
    the default betas the per-coordinate step is eta in round 1 but grows to about 2.1 * eta near
    round 10 and only slowly settles back to eta. A step that grows over the rounds is the very
    trap of server momentum (it makes a model diverge when each round is a large share of the data);
    corrected, the step stays about eta from the first round, so eta means the same thing in a
    33-round session as in a 1000-round one.
    Moments start at zero as in Flower (the paper allows any v_{-1} >= tau**2); tau keeps the
    denominator positive.

    State: ``t`` (merges done), ``m`` and ``v`` (float64 vectors, absent before the first merge).
    """

    eta: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.99
    tau: float = 1e-3
    bias_correction: bool = True
    m: np.ndarray | None = field(default=None, init=False, repr=False)
    v: np.ndarray | None = field(default=None, init=False, repr=False)
    t: int = field(default=0, init=False)

    name: ClassVar[str] = "fedadam"
    is_stateful: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.eta = checked_number(self.name, "eta", self.eta, above=0)
        self.beta_1 = checked_number(self.name, "beta_1", self.beta_1, at_least=0, below=1)
        self.beta_2 = checked_number(self.name, "beta_2", self.beta_2, at_least=0, below=1)
        self.tau = checked_number(self.name, "tau", self.tau, above=0)
        self.bias_correction = checked_flag(self.name, "bias_correction", self.bias_correction)

    def merge(
        self,
        global_weights: np.ndarray,
        results: Sequence[Result],
        *,
        spec: WeightSpec | None = None,
        aggregator: Aggregator | None = None,
    ) -> np.ndarray:
        global64, vectors, counts = check_results(global_weights, results, spec)
        m = np.zeros_like(global64) if self.m is None else self.m
        v = np.zeros_like(global64) if self.v is None else self.v
        if m.shape != global64.shape or v.shape != global64.shape:
            raise StateMismatch(f"fedadam moments have {m.shape[0]} values, weights have {global64.shape[0]}")
        new_weights, self.m, self.v = fedadam_update(
            global64,
            or_mean(aggregator).combine(global64, vectors, counts),
            m,
            v,
            self.t + 1,
            eta=self.eta,
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            tau=self.tau,
            bias_correction=self.bias_correction,
        )
        self.t += 1
        return new_weights.astype(np.float32)

    def state_dict(self) -> StateDict:
        state: StateDict = {"t": self.t}
        if self.m is not None and self.v is not None:
            state["m"], state["v"] = self.m.copy(), self.v.copy()
        return state

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        keys = set(state)
        if keys not in ({"t"}, {"t", "m", "v"}):
            raise StateMismatch(f"fedadam state needs 't' and, after the first merge, 'm' and 'v'; got {sorted(state)}")
        t = checked_round_count(self.name, state["t"])
        if (t == 0) != (keys == {"t"}):
            raise StateMismatch(f"fedadam state has t={t} with{'out' if keys == {'t'} else ''} moments")
        if t == 0:
            self.reset()
            return
        m = checked_state_array(self.name, "m", state["m"])
        v = checked_state_array(self.name, "v", state["v"], m.shape[0])
        if (v < 0).any():
            raise StateMismatch("fedadam state 'v' holds negative values; a second moment cannot")
        self.t, self.m, self.v = t, m, v

    def reset(self) -> None:
        self.t, self.m, self.v = 0, None, None
