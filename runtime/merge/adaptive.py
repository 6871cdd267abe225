"""The adaptive server optimizers of Reddi et al.: FedAdam, FedYogi and FedAdagrad, sharing one class.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan 2021, "Adaptive Federated
Optimization" (ICLR), Algorithm 2. The round's change ``average - global`` is the pseudo-gradient
(``delta``); the server keeps a first moment ``m`` of it (momentum, decay ``beta_1``) and a second moment
``v`` (the three methods differ only in how ``v`` is updated), and steps by ``eta * m / (sqrt(v) + tau)``.

Where tau sits: outside the square root, added to ``sqrt(v)`` (as in the paper and in Flower), so it bounds
how far a coordinate with a tiny second moment can move per round: at most about ``eta * |m| / tau``.

Note the step uses the first moment ``m``, not ``delta``: Flower's FedAdam once used ``delta`` there
(flower#893). Both moments start at zero, as in Flower (the paper allows any v_{-1} >= tau**2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


def adam_second_moment(v: np.ndarray, delta: np.ndarray, beta_2: float) -> np.ndarray:
    """v = beta_2 * v + (1 - beta_2) * delta**2 (an exponential average: old rounds fade)."""
    return beta_2 * v + (1.0 - beta_2) * delta * delta


def yogi_second_moment(v: np.ndarray, delta: np.ndarray, beta_2: float) -> np.ndarray:
    """v = v - (1 - beta_2) * delta**2 * sign(v - delta**2) (Zaheer et al. 2018): v moves towards delta**2 by a
    step of (1 - beta_2) * delta**2 whatever the gap, so it grows as Adam's does but shrinks more slowly."""
    squared = delta * delta
    return v - (1.0 - beta_2) * squared * np.sign(v - squared)


def adagrad_second_moment(v: np.ndarray, delta: np.ndarray, beta_2: float) -> np.ndarray:
    """v = v + delta**2 (a sum that never forgets; ``beta_2`` plays no part)."""
    return v + delta * delta


SecondMoment = Callable[[np.ndarray, np.ndarray, float], np.ndarray]


def adaptive_update(
    global_weights: np.ndarray,
    average: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    t: int,
    *,
    second_moment: SecondMoment,
    eta: float,
    beta_1: float,
    beta_2: float,
    tau: float,
    correct_m: bool,
    correct_v: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Server step number ``t`` (1-based) in float64; returns (new global weights, m, v).

    delta = average - global
    m     = beta_1 * m + (1 - beta_1) * delta              (m and v start at 0)
    v     = second_moment(v, delta, beta_2)
    m_hat = m / (1 - beta_1**t) if correct_m else m;  v_hat = v / (1 - beta_2**t) if correct_v else v
    new   = global + eta * m_hat / (sqrt(v_hat) + tau)
    """
    delta = average - global_weights
    m = beta_1 * m + (1.0 - beta_1) * delta
    v = second_moment(v, delta, beta_2)
    m_hat = m / (1.0 - beta_1**t) if correct_m else m
    v_hat = v / (1.0 - beta_2**t) if correct_v else v
    return global_weights + eta * m_hat / (np.sqrt(v_hat) + tau), m, v


def fedadam_update(global_weights: np.ndarray, average: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, *,
                   eta: float, beta_1: float, beta_2: float, tau: float,
                   bias_correction: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FedAdam's step (``adaptive_update`` with Adam's second moment, both moments corrected or neither)."""
    return adaptive_update(global_weights, average, m, v, t, second_moment=adam_second_moment, eta=eta,
                           beta_1=beta_1, beta_2=beta_2, tau=tau, correct_m=bias_correction,
                           correct_v=bias_correction)


@dataclass(eq=False)
class AdaptiveServerOptimizer(MergeMethod):
    """What FedAdam, FedYogi and FedAdagrad share: hyperparameters, the moments and their state round trip.

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

    is_stateful: ClassVar[bool] = True
    second_moment: ClassVar[SecondMoment] = staticmethod(adam_second_moment)
    v_decays: ClassVar[bool] = True  # whether v is an exponential average (shrunk early on: corrected) or a sum

    def __post_init__(self) -> None:
        self.eta = checked_number(self.name, "eta", self.eta, above=0)
        self.beta_1 = checked_number(self.name, "beta_1", self.beta_1, at_least=0, below=1)
        self.beta_2 = checked_number(self.name, "beta_2", self.beta_2, at_least=0, below=1)
        self.tau = checked_number(self.name, "tau", self.tau, above=0)
        self.bias_correction = checked_flag(self.name, "bias_correction", self.bias_correction)

    def check_state(self, global64: np.ndarray) -> None:
        for name, moment in (("m", self.m), ("v", self.v)):
            if moment is not None and moment.shape != global64.shape:
                raise StateMismatch(f"{self.name} moment {name} has {moment.shape[0]} values, weights have "
                                    f"{global64.shape[0]}")

    def step(self, global64: np.ndarray, average: np.ndarray) -> np.ndarray:
        m = np.zeros_like(global64) if self.m is None else self.m
        v = np.zeros_like(global64) if self.v is None else self.v
        new_weights, self.m, self.v = adaptive_update(
            global64,
            average,
            m,
            v,
            self.t + 1,
            second_moment=type(self).second_moment,
            eta=self.eta,
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            tau=self.tau,
            correct_m=self.bias_correction,
            correct_v=self.bias_correction and self.v_decays,
        )
        self.t += 1
        return new_weights

    def state_dict(self) -> StateDict:
        state: StateDict = {"t": self.t}
        if self.m is not None and self.v is not None:
            state["m"], state["v"] = self.m.copy(), self.v.copy()
        return state

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        keys = set(state)
        if keys not in ({"t"}, {"t", "m", "v"}):
            raise StateMismatch(f"{self.name} state needs 't' and, after the first merge, 'm' and 'v'; "
                                f"got {sorted(state)}")
        t = checked_round_count(self.name, state["t"])
        if (t == 0) != (keys == {"t"}):
            raise StateMismatch(f"{self.name} state has t={t} with{'out' if keys == {'t'} else ''} moments")
        if t == 0:
            self.reset()
            return
        m = checked_state_array(self.name, "m", state["m"])
        v = checked_state_array(self.name, "v", state["v"], m.shape[0])
        if (v < 0).any():
            raise StateMismatch(f"{self.name} state 'v' holds negative values; a second moment cannot")
        self.t, self.m, self.v = t, m, v

    def reset(self) -> None:
        self.t, self.m, self.v = 0, None, None


@dataclass(eq=False)
class FedAdam(AdaptiveServerOptimizer):
    """Adam on the server. Defaults: eta 0.01, beta_1 0.9, beta_2 0.99, tau 1e-3 (outside the sqrt).

    Bias correction is ON by default (``bias_correction=True``, both moments); ``False`` gives the paper's
    Algorithm 2, which has none. Why: both moments start at zero, so without correction they
    are shrunk by (1 - beta_1**t) and (1 - beta_2**t), and the two shrinkages do not cancel: with
    the default betas the per-coordinate step is eta in round 1 but grows to about 2.1 * eta near
    round 10 and only slowly settles back to eta. A step that grows over the rounds is the very
    trap of server momentum (it makes a model diverge when each round is a large share of the data);
    corrected, the step stays about eta from the first round, so eta means the same thing in a
    33-round session as in a 1000-round one.
    """

    name: ClassVar[str] = "fedadam"


@dataclass(eq=False)
class FedYogi(AdaptiveServerOptimizer):
    """Yogi on the server: Adam's step with Yogi's additive second moment (``yogi_second_moment``).
    Defaults as FedAdam's: eta 0.01, beta_1 0.9, beta_2 0.99, tau 1e-3 (outside the sqrt).

    Bias correction is ON by default for both moments, as FedAdam's, and for the same reason: from v = 0 Yogi's
    v grows by (1 - beta_2) * delta**2 per round, as Adam's does, so it starts shrunk by about (1 - beta_2**t)
    too (exactly so while delta**2 stays above v). ``False``: the paper's Algorithm 2, without correction.
    """

    name: ClassVar[str] = "fedyogi"
    second_moment: ClassVar[SecondMoment] = staticmethod(yogi_second_moment)


@dataclass(eq=False)
class FedAdagrad(AdaptiveServerOptimizer):
    """Adagrad on the server: v is the sum of every round's delta**2 (``beta_2`` is unused: it stays a setting
    only so one grid can cover the three methods). Defaults: eta 0.01, beta_1 0.9, tau 1e-3 (outside the sqrt).

    Bias correction applies to the first moment only (``bias_correction=True``, the default): m starts at zero
    and is shrunk by (1 - beta_1**t); v is a sum, not an average, so it is not shrunk and is never corrected.
    The step therefore shrinks like 1/sqrt(rounds) on a coordinate whose delta keeps its size.
    """

    name: ClassVar[str] = "fedadagrad"
    second_moment: ClassVar[SecondMoment] = staticmethod(adagrad_second_moment)
    v_decays: ClassVar[bool] = False
