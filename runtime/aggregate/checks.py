"""What aggregators and merge methods share: the result type, the named errors and the checks.

Both kinds of object are small dataclasses: their init fields are the hyperparameters (JSON round
trip through ``to_config``/``from_config``); their server state lives in non-init fields and travels
through ``state_dict``/``load_state_dict`` as one flat dict whose values are JSON scalars or numpy
arrays, so the relay can keep the arrays in safetensors and the rest in JSON (see ``split_state``).

This module sits below both ``runtime.aggregate`` and ``runtime.merge`` (which re-exports it), so that
the merge methods can use the aggregators without an import cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np

from runtime.weights import WeightSpec

StateValue = int | float | np.ndarray
StateDict = dict[str, StateValue]


class MergeError(ValueError):
    """Base of every merge (and aggregation) failure."""


class NoResults(MergeError):
    """A round ended with no results to merge."""


class ResultSpecMismatch(MergeError):
    """A result's vector (or spec) does not match the global weights; numpy must not broadcast it."""


class NonFiniteResult(MergeError):
    """A result holds NaN or infinity."""


class InvalidExampleCount(MergeError):
    """A result's ``num_examples`` is negative or not an integer."""


class ZeroTotalExamples(MergeError):
    """Results exist but together report zero examples, so there is nothing to weight them by."""


class TooFewResults(MergeError):
    """A robust aggregator needs more results than the round has (Krum: k > 2f + 2; a trim that keeps none)."""


class InvalidHyperparameter(MergeError):
    """A hyperparameter is out of its range or unknown to the method."""


class StateMismatch(MergeError):
    """A saved server state does not fit this method or these weights."""


class UnknownName(MergeError, KeyError):
    """No registered method has this name."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


class UnknownMerge(UnknownName):
    """No merge method has this name."""


class UnknownAggregator(UnknownName):
    """No aggregator has this name."""


@dataclass(frozen=True)
class Result:
    """One peer's contribution to a round: its new flat float32 weights and how many examples it trained on."""

    weights: np.ndarray
    num_examples: int
    spec: WeightSpec | None = None


class Configurable:
    """Base of merge methods and aggregators: subclasses are dataclasses whose init fields are hyperparameters."""

    name: ClassVar[str]
    is_stateful: ClassVar[bool]

    def state_dict(self) -> StateDict:
        return {}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        if state:
            raise StateMismatch(f"{self.name} keeps no server state, got keys {sorted(state)}")

    def reset(self) -> None:
        """Forget the server state (e.g. when the relay starts a new session)."""

    def to_config(self) -> dict[str, Any]:
        """Hyperparameters as a JSON-able dict (``from_config`` reverses it)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}  # type: ignore[arg-type]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Self:
        known = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
        unknown = sorted(set(config) - known)
        if unknown:
            raise InvalidHyperparameter(f"{cls.name} has no hyperparameter {unknown[0]!r}; it takes {sorted(known)}")
        return cls(**config)


def check_results(
    global_weights: np.ndarray, results: Sequence[Result], spec: WeightSpec | None = None
) -> tuple[np.ndarray, list[np.ndarray], list[int]]:
    """Validate a round's inputs; return (global as float64, results' weights, results' example counts)."""
    global_weights = np.asarray(global_weights)
    if global_weights.ndim != 1:
        raise ResultSpecMismatch(f"global weights must be a 1-D vector, got shape {list(global_weights.shape)}")
    if spec is not None and spec.size != global_weights.shape[0]:
        raise ResultSpecMismatch(f"global weights have {global_weights.shape[0]} values, spec needs {spec.size}")
    if not results:
        raise NoResults("no results to merge")
    vectors, counts = [], []
    for index, result in enumerate(results):
        weights = np.asarray(result.weights)
        if weights.ndim != 1 or weights.shape[0] != global_weights.shape[0]:
            raise ResultSpecMismatch(
                f"result {index} has shape {list(weights.shape)}, global weights have {global_weights.shape[0]} values"
            )
        if result.spec is not None and spec is not None and result.spec != spec:
            raise ResultSpecMismatch(f"result {index} spec differs: {spec.first_difference(result.spec)}")
        if result.spec is not None and result.spec.size != weights.shape[0]:
            raise ResultSpecMismatch(f"result {index} has {weights.shape[0]} values, its spec says {result.spec.size}")
        if not np.isfinite(weights).all():
            raise NonFiniteResult(f"result {index} has {int((~np.isfinite(weights)).sum())} non-finite weights")
        count = result.num_examples
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
            raise InvalidExampleCount(f"result {index} reports num_examples={count!r}; need an integer >= 0")
        vectors.append(weights)
        counts.append(int(count))
    if sum(counts) == 0:
        raise ZeroTotalExamples(f"the {len(results)} results report zero examples in total")
    return global_weights.astype(np.float64), vectors, counts


def checked_state_array(method: str, key: str, value: Any, size: int | None = None) -> np.ndarray:
    """A saved state array as float64 (a fresh copy), checked to be 1-D and finite."""
    if not isinstance(value, np.ndarray) or value.ndim != 1:
        raise StateMismatch(f"{method} state {key!r} must be a 1-D numpy array, got {type(value).__name__}")
    if size is not None and value.shape[0] != size:
        raise StateMismatch(f"{method} state {key!r} has {value.shape[0]} values, expected {size}")
    if not np.isfinite(value).all():
        raise StateMismatch(f"{method} state {key!r} holds non-finite values")
    return value.astype(np.float64)


def split_state(state: Mapping[str, StateValue]) -> tuple[dict[str, np.ndarray], dict[str, int | float]]:
    """(arrays for safetensors, scalars for JSON)."""
    arrays = {key: value for key, value in state.items() if isinstance(value, np.ndarray)}
    scalars = {key: value for key, value in state.items() if not isinstance(value, np.ndarray)}
    return arrays, scalars


def join_state(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, int | float]) -> StateDict:
    overlap = sorted(set(arrays) & set(scalars))
    if overlap:
        raise StateMismatch(f"state key {overlap[0]!r} is both an array and a scalar")
    return {**scalars, **arrays}


def checked_number(
    method: str,
    name: str,
    value: Any,
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
) -> float:
    """A hyperparameter as float, or InvalidHyperparameter saying which bound it breaks."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise InvalidHyperparameter(f"{method} {name} must be a finite number, got {value!r}")
    if above is not None and not value > above:
        raise InvalidHyperparameter(f"{method} {name} must be > {above}, got {value!r}")
    if at_least is not None and not value >= at_least:
        raise InvalidHyperparameter(f"{method} {name} must be >= {at_least}, got {value!r}")
    if below is not None and not value < below:
        raise InvalidHyperparameter(f"{method} {name} must be < {below}, got {value!r}")
    return float(value)


def checked_integer(method: str, name: str, value: Any, *, at_least: int) -> int:
    """A whole-number hyperparameter (a count: no float, no bool), or InvalidHyperparameter."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidHyperparameter(f"{method} {name} must be an integer, got {value!r}")
    if value < at_least:
        raise InvalidHyperparameter(f"{method} {name} must be >= {at_least}, got {value!r}")
    return int(value)


def checked_flag(method: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidHyperparameter(f"{method} {name} must be true or false, got {value!r}")
    return value


def checked_round_count(method: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise StateMismatch(f"{method} state 't' must be an integer >= 0, got {value!r}")
    return int(value)
