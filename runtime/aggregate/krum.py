"""Krum: the one result closest to its nearest neighbours.

Blanchard, El Mhamdi, Guerraoui and Stainer 2017, "Machine Learning with Adversaries: Byzantine
Tolerant Gradient Descent" (NeurIPS). With k results of which at most f are Byzantine and
k > 2f + 2, each result is scored by the squared distances to its k - f - 2 nearest others; Krum
returns the result with the lowest score. Distances between weights equal distances between updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from runtime.aggregate.base import STACKED_ROW_BYTES, Aggregator, Outliers, stacked
from runtime.aggregate.checks import TooFewResults, checked_integer


def krum_scores(matrix: np.ndarray, f: int) -> np.ndarray:
    """matrix: (k, n) float64, k > 2f + 2 -> scores (k,).

    d[i, j]  = ||x_i - x_j||^2                                  (k, k), in float64
    score_i  = sum of the k - f - 2 smallest d[i, j] over j != i
    """
    k = matrix.shape[0]
    neighbours = k - f - 2
    scores = np.empty(k, dtype=np.float64)
    for i in range(k):
        distances = np.square(matrix - matrix[i]).sum(axis=1)
        scores[i] = np.sort(np.delete(distances, i))[:neighbours].sum()
    return scores


def checked_round_size(method: str, k: int, f: int) -> None:
    if k <= 2 * f + 2:
        raise TooFewResults(f"{method} with f={f} needs more than 2f + 2 = {2 * f + 2} results, got {k}")


def lowest_scores(scores: np.ndarray, m: int) -> np.ndarray:
    """The indices of the m lowest scores in increasing order of index; ties go to the lower index."""
    return np.sort(np.argsort(scores, kind="stable")[:m])


@dataclass(eq=False)
class Krum(Aggregator):
    """Krum's choice: the result with the lowest score (ties: the lowest index). Default f = 1 (k >= 5).

    Needs k > 2f + 2 results, else ``TooFewResults``. ``last_outliers``: every result not chosen. No state.
    """

    f: int = 1

    name: ClassVar[str] = "krum"
    is_stateful: ClassVar[bool] = False
    row_bytes: ClassVar[int] = STACKED_ROW_BYTES

    def __post_init__(self) -> None:
        self.f = checked_integer(self.name, "f", self.f, at_least=0)

    def _combine(
        self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]
    ) -> tuple[np.ndarray, Outliers]:
        checked_round_size(self.name, len(vectors), self.f)
        matrix = stacked(vectors)
        chosen = int(lowest_scores(krum_scores(matrix, self.f), 1)[0])
        return matrix[chosen], tuple(i for i in range(len(vectors)) if i != chosen)
