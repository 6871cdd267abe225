"""The aggregator interface: a round's checked results in, the one average out.

A merge method (``runtime.merge``) is a server optimizer: it asks an aggregator for the round's average
and then takes its step (FedAvg: new = average; FedAvgM and FedAdam: pseudo-gradient = average - global).
Any aggregator composes with any merge method.

Inputs have passed ``check_results`` (shapes, finite values, example counts) before an aggregator sees
them. Results that report zero examples take no part: the mean gives them weight zero, and the robust
aggregators leave them out, so k always counts the results with ``num_examples > 0``. Outlier indices
are positions in the round's full list of results.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.aggregate.checks import Configurable, Result, check_results
from runtime.weights import WeightSpec

Outliers = tuple[int, ...]


class Aggregator(Configurable):
    """Base class: subclasses are dataclasses of their hyperparameters and implement ``_combine``.

    ``last_outliers``: the results the last call set aside or distrusted (each subclass says which), as
    indices into that call's results in increasing order; ``()`` before any call, after ``reset`` and
    after a call that raised.
    """

    last_outliers: Outliers = ()

    def aggregate(
        self, global_weights: np.ndarray, results: Sequence[Result], *, spec: WeightSpec | None = None
    ) -> np.ndarray:
        """Check the round's results, then combine them: the average as a float32 vector of the global shape."""
        global64, vectors, counts = check_results(global_weights, results, spec)
        return self.combine(global64, vectors, counts).astype(np.float32)

    def combine(self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]) -> np.ndarray:
        """The average in float64 from ``check_results``'s output (what the merge methods call)."""
        self.last_outliers = ()
        taking_part = [index for index, count in enumerate(counts) if count > 0]
        average, outliers = self._combine(
            global_weights, [vectors[i] for i in taking_part], [counts[i] for i in taking_part]
        )
        self.last_outliers = tuple(sorted(taking_part[i] for i in outliers))
        return average

    def _combine(
        self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]
    ) -> tuple[np.ndarray, Outliers]:
        """(average as float64, outliers as indices into ``vectors``); every count here is > 0."""
        raise NotImplementedError

    def reset(self) -> None:
        self.last_outliers = ()


def stacked(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """The results as one float64 matrix, one row per result: (k, n)."""
    return np.stack([np.asarray(vector, dtype=np.float64) for vector in vectors])
