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
from typing import ClassVar

import numpy as np

from runtime.aggregate.checks import Configurable, Result, check_results
from runtime.aggregate.streaming import Reread, Stream
from runtime.weights import WeightSpec

Outliers = tuple[int, ...]


class Aggregator(Configurable):
    """Base class: subclasses are dataclasses of their hyperparameters and implement ``_combine``.

    ``last_outliers``: the results the last call set aside or distrusted (each subclass says which), as
    indices into that call's results in increasing order; ``()`` before any call, after ``reset`` and
    after a call that raised.
    """

    last_outliers: Outliers = ()
    # Bytes a merge holds per weight per result beyond the results themselves: 0 for those that go over the results
    # one at a time (mean, centered clipping); the float64 matrix of every result and a temporary for those that
    # need every row at once (median, trimmed mean, Krum).
    row_bytes: ClassVar[int] = 0

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

    # -- one result at a time (``runtime.aggregate.streaming``) ------------------------------------------------
    def streams(self) -> bool:
        """Whether this aggregator takes a round's results one at a time as they arrive (``open_stream``, then
        ``Stream.add`` per result, then ``finish_stream``), to the bits ``combine`` gives on them all at once."""
        return False

    def open_stream(self, global_weights: np.ndarray) -> Stream:
        """A round's sum, opened from the global weights (float64) and this aggregator's state."""
        raise NotImplementedError(f"{self.name} needs every result of a round at once")

    def finish_stream(self, stream: Stream, reread: Reread) -> tuple[np.ndarray, list[object]]:
        """(the average in float64, the keys of the results it set aside or distrusted); updates the state as
        ``combine`` would. ``reread(key)``: a result's weights again (only for those the aggregator must look at
        twice)."""
        raise NotImplementedError(f"{self.name} needs every result of a round at once")

    def combine_by_stream(self, global_weights: np.ndarray, vectors: Sequence[np.ndarray],
                          counts: Sequence[int]) -> tuple[np.ndarray, Outliers]:
        """``_combine`` for the aggregators that stream: the results added in order through a ``Stream``, so the
        round merged at once and the round summed as it arrived give the same bits."""
        stream = self.open_stream(global_weights)
        for index, (vector, count) in enumerate(zip(vectors, counts, strict=True)):
            stream.add(index, vector, count)
        average, outliers = self.finish_stream(stream, lambda index: vectors[int(index)])  # type: ignore[call-overload]
        return average, tuple(int(index) for index in outliers)  # type: ignore[call-overload]


STACKED_ROW_BYTES = 16  # ``stacked``'s float64 matrix and one temporary of its size


def fit_refusal(aggregator: Aggregator, results: int, size: int, memory_bytes: int) -> str | None:
    """Why ``aggregator`` cannot merge ``results`` results of ``size`` weights with ``memory_bytes`` to spare (None:
    it can): Krum's assumption k > 2f + 2, and the matrix of every result the row-at-once aggregators hold."""
    assumed = getattr(aggregator, "f", None)
    if isinstance(assumed, int) and results <= 2 * assumed + 2:
        return (f"{aggregator.name} with f={assumed} needs more than {2 * assumed + 2} results a round; this session "
                f"has k={results}")
    needed = aggregator.row_bytes * results * size
    if needed > memory_bytes:
        return (f"{aggregator.name} holds every result of a round at once, {aggregator.row_bytes} bytes a weight: "
                f"k={results} x {size:,} weights is {needed / 2**30:.1f} GiB, more than the {memory_bytes / 2**30:.1f} "
                "GiB a merge may use here; choose centered_clipping (the default) or mean, which go over the "
                "results one at a time, or fewer participants")
    return None


def stacked(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """The results as one float64 matrix, one row per result: (k, n)."""
    return np.stack([np.asarray(vector, dtype=np.float64) for vector in vectors])
