"""Merge methods, chosen by name: ``make_merge("fedadam", eta=0.03)``.

Each method is a small dataclass of its hyperparameters plus its server state, with
``merge(global_weights, results) -> new_global_weights`` on flat float32 vectors. The round's average comes
from an aggregator (``runtime.aggregate``): ``merge(global_weights, results, aggregator=Median())``; by
default the example-weighted mean.
"""

from __future__ import annotations

from typing import Any

from runtime.merge.adaptive import (
    AdaptiveServerOptimizer,
    FedAdagrad,
    FedAdam,
    FedYogi,
    adaptive_update,
    fedadam_update,
)
from runtime.merge.base import (
    InvalidExampleCount,
    InvalidHyperparameter,
    MergeError,
    MergeMethod,
    NonFiniteResult,
    NoResults,
    Result,
    ResultSpecMismatch,
    StateDict,
    StateMismatch,
    UnknownMerge,
    ZeroTotalExamples,
    join_state,
    split_state,
)
from runtime.merge.fedavg import FedAvg
from runtime.merge.fedavgm import FedAvgM, fedavgm_update

MERGES: dict[str, type[MergeMethod]] = {"fedavg": FedAvg, "fedavgm": FedAvgM, "fedadam": FedAdam, "fedyogi": FedYogi,
                                         "fedadagrad": FedAdagrad}


def merge_class(name: str) -> type[MergeMethod]:
    try:
        return MERGES[name]
    except KeyError:
        raise UnknownMerge(f"unknown merge method {name!r}; choose one of {', '.join(MERGES)}") from None


def make_merge(name: str, **hyperparameters: Any) -> MergeMethod:
    """A fresh merge method (no server state) by name, e.g. ``make_merge("fedavgm", server_momentum=0.5)``."""
    return merge_class(name).from_config(hyperparameters)


__all__ = [
    "MERGES",
    "AdaptiveServerOptimizer",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedYogi",
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
    "UnknownMerge",
    "ZeroTotalExamples",
    "adaptive_update",
    "fedadam_update",
    "fedavgm_update",
    "join_state",
    "make_merge",
    "merge_class",
    "split_state",
]
