"""Aggregators, chosen by name: ``make_aggregator("trimmed_mean", fraction=0.2)``.

An aggregator turns a round's checked results into the one average; a merge method (``runtime.merge``)
then takes its server step with it: ``FedAdam().merge(global_weights, results, aggregator=Median())``.
Each is a small dataclass of its hyperparameters (plus any state), with ``aggregate(global_weights,
results) -> float32 average`` and ``last_outliers``, the results it set aside in its last call.
"""

from __future__ import annotations

from typing import Any

from runtime.aggregate.base import Aggregator, Outliers
from runtime.aggregate.centered_clipping import CenteredClipping, centered_clip, default_radius
from runtime.aggregate.checks import TooFewResults, UnknownAggregator
from runtime.aggregate.krum import Krum, krum_scores
from runtime.aggregate.mean import Mean
from runtime.aggregate.median import Median, coordinate_median
from runtime.aggregate.multikrum import MultiKrum, multikrum
from runtime.aggregate.trimmed_mean import TrimmedMean, trim_count, trimmed_mean

AGGREGATORS: dict[str, type[Aggregator]] = {
    "mean": Mean,
    "median": Median,
    "trimmed_mean": TrimmedMean,
    "krum": Krum,
    "multikrum": MultiKrum,
    "centered_clipping": CenteredClipping,
}


def aggregator_class(name: str) -> type[Aggregator]:
    try:
        return AGGREGATORS[name]
    except KeyError:
        raise UnknownAggregator(f"unknown aggregator {name!r}; choose one of {', '.join(AGGREGATORS)}") from None


def make_aggregator(name: str, **config: Any) -> Aggregator:
    """A fresh aggregator (no state) by name, e.g. ``make_aggregator("krum", f=2)``."""
    return aggregator_class(name).from_config(config)


__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "CenteredClipping",
    "Krum",
    "Mean",
    "Median",
    "MultiKrum",
    "Outliers",
    "TooFewResults",
    "TrimmedMean",
    "UnknownAggregator",
    "aggregator_class",
    "centered_clip",
    "coordinate_median",
    "default_radius",
    "krum_scores",
    "make_aggregator",
    "multikrum",
    "trim_count",
    "trimmed_mean",
]
