"""Multi-Krum: the mean of the m results with the lowest Krum scores.

Blanchard, El Mhamdi, Guerraoui and Stainer 2017, "Machine Learning with Adversaries: Byzantine
Tolerant Gradient Descent" (NeurIPS), section 5 (Multi-Krum). Scores as in ``runtime.aggregate.krum``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.aggregate.base import STACKED_ROW_BYTES, Aggregator, Outliers, stacked
from runtime.aggregate.checks import TooFewResults, checked_integer
from runtime.aggregate.krum import checked_round_size, krum_scores, lowest_scores


def multikrum(matrix: np.ndarray, f: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """matrix: (k, n) float64, k > 2f + 2, 1 <= m <= k -> (the mean (n,), the chosen indices (m,)).

    chosen = the m lowest Krum scores (ties: lower index), in increasing order of index
    mean   = sum of the chosen rows / m
    """
    chosen = lowest_scores(krum_scores(matrix, f), m)
    return matrix[chosen].sum(axis=0) / m, chosen


@dataclass(eq=False)
class MultiKrum(Aggregator):
    """The plain (unweighted) mean of the m best-scored results, as in the paper. Defaults f = 1, m = k - f.

    Unweighted like the other robust aggregators: a peer's example count is its own claim, and weighting
    by it would let one chosen peer outweigh the others. ``m=None`` means k - f in every round (so with
    f = 0 and every result chosen it is the unweighted mean). Needs k > 2f + 2 and m <= k, else
    ``TooFewResults``. ``last_outliers``: the results not chosen. No state.
    """

    f: int = 1
    m: int | None = None

    name: ClassVar[str] = "multikrum"
    is_stateful: ClassVar[bool] = False
    row_bytes: ClassVar[int] = STACKED_ROW_BYTES

    def __post_init__(self) -> None:
        self.f = checked_integer(self.name, "f", self.f, at_least=0)
        if self.m is not None:
            self.m = checked_integer(self.name, "m", self.m, at_least=1)

    def _combine(
        self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]
    ) -> tuple[np.ndarray, Outliers]:
        k = len(vectors)
        checked_round_size(self.name, k, self.f)
        m = k - self.f if self.m is None else self.m
        if m > k:
            raise TooFewResults(f"multikrum with m={m} needs at least {m} results, got {k}")
        mean, chosen = multikrum(stacked(vectors), self.f, m)
        kept = set(chosen.tolist())
        return mean, tuple(i for i in range(k) if i not in kept)
