"""What every merge method shares: the merge interface, plus (re-exported) the result type, the named
errors and the checks that merge methods and aggregators share (``runtime.aggregate.checks``).

A merge method is the server optimizer: it takes the round's average from an aggregator
(``runtime.aggregate``; by default ``Mean``, the example-weighted mean) and makes its step with it.
It is a small dataclass: its fields are the hyperparameters (JSON round trip through
``to_config``/``from_config``); its server state lives in non-init fields and travels through
``state_dict``/``load_state_dict`` as one flat dict whose values are JSON scalars or numpy arrays,
so the relay can keep the arrays in safetensors and the rest in JSON (see ``split_state``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.aggregate.base import Aggregator
from runtime.aggregate.checks import (
    Configurable,
    InvalidExampleCount,
    InvalidHyperparameter,
    MergeError,
    NonFiniteResult,
    NoResults,
    Result,
    ResultSpecMismatch,
    StateDict,
    StateMismatch,
    StateValue,
    UnknownMerge,
    ZeroTotalExamples,
    check_results,
    checked_flag,
    checked_number,
    checked_round_count,
    checked_state_array,
    join_state,
    split_state,
)
from runtime.aggregate.mean import Mean
from runtime.weights import WeightSpec


class MergeMethod(Configurable):
    """Base class: subclasses are dataclasses whose init fields are hyperparameters.

    After each merge ``last_delta`` holds the round's pseudo-gradient, average - global (float64), for the
    history's diagnostics (``runtime.merge.diagnostics``); it is not server state and is not saved.
    """

    last_delta: np.ndarray | None = None

    def merge(
        self,
        global_weights: np.ndarray,
        results: Sequence[Result],
        *,
        spec: WeightSpec | None = None,
        aggregator: Aggregator | None = None,
    ) -> np.ndarray:
        """The new global weights (float32) from the round's results, averaged by ``aggregator`` (None: ``Mean()``).

        The results are checked (``check_results``) and the method's state (``check_state``) before the
        aggregator sees them; a refused round leaves the method's and the aggregator's state alone.
        """
        global64, vectors, counts = check_results(global_weights, results, spec)
        self.check_state(global64)
        average = or_mean(aggregator).combine(global64, vectors, counts)
        return self.merge_average(global64, average)

    def merge_average(self, global_weights: np.ndarray, average: np.ndarray) -> np.ndarray:
        """The new global weights (float32) from an average an aggregator made already (float64): a round summed
        as its results arrived (``Aggregator.finish_stream``)."""
        global64 = np.asarray(global_weights, dtype=np.float64)
        self.check_state(global64)
        self.last_delta = average - global64
        return self.step(global64, average).astype(np.float32)

    def check_state(self, global64: np.ndarray) -> None:
        """Raise ``StateMismatch`` when the server state does not fit these weights (stateless: nothing)."""

    def step(self, global64: np.ndarray, average: np.ndarray) -> np.ndarray:
        """The server optimizer's step from the global weights to new ones, given the round's average (float64);
        updates the method's state."""
        raise NotImplementedError


def or_mean(aggregator: Aggregator | None) -> Aggregator:
    """The aggregator a merge uses: the one given, else the example-weighted mean."""
    return Mean() if aggregator is None else aggregator


__all__ = [
    "InvalidExampleCount",
    "InvalidHyperparameter",
    "MergeError",
    "MergeMethod",
    "NoResults",
    "NonFiniteResult",
    "Result",
    "ResultSpecMismatch",
    "StateDict",
    "StateMismatch",
    "StateValue",
    "UnknownMerge",
    "ZeroTotalExamples",
    "check_results",
    "checked_flag",
    "checked_number",
    "checked_round_count",
    "checked_state_array",
    "join_state",
    "or_mean",
    "split_state",
]
