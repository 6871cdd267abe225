"""Centered clipping: start from the last round's aggregate and move towards each result by at most a radius.

Karimireddy, He and Jaggi 2021, "Learning from History for Byzantine Robust Optimization" (ICML),
centered clipping (CC). The paper clips workers' (momentum) gradients around the previous aggregate;
here everything is an update in weight space:

    x_i = w_i - global          result i's update                           (n,)
    v_0 = the previous round's aggregated update (zero in the first round, i.e. the global weights)
    v  <- v + sum_i p_i clip_tau(x_i - v),   clip_tau(z) = z * min(1, tau / ||z||),   L times
    (p_i = n_i / sum n: example shares; equal counts give the paper's mean)
    average = global + v_L

so with FedAvg the round's step is v_L, and v_L is the next round's starting point (the "history").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, overload

import numpy as np

from runtime.aggregate.base import Aggregator, Outliers
from runtime.aggregate.checks import (
    MergeError,
    StateDict,
    StateMismatch,
    StateValue,
    checked_integer,
    checked_number,
    checked_state_array,
)
from runtime.aggregate.streaming import Reread, Stream

RADIUS_FACTOR = 2.0  # radius=None: tau = RADIUS_FACTOR * the median distance ||x_i - v_0|| of the round


class Updates(Sequence[np.ndarray]):
    """The results' updates x_i = w_i - global as float64 rows, each made when it is read: the round's results stay
    as they came (float32, or whatever the codec decoded) and no (k, n) float64 matrix is built. That matrix and
    its temporaries cost 3-4 times the results themselves (the relay's memory grew about 21 MB per bytetext result
    with it); each row computes exactly what that matrix's row held, so the aggregate keeps its bits."""

    def __init__(self, vectors: Sequence[np.ndarray], global_weights: np.ndarray) -> None:
        self.vectors, self.global_weights = vectors, global_weights

    def __len__(self) -> int:
        return len(self.vectors)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        if isinstance(index, slice):
            return Updates(self.vectors[index], self.global_weights)
        return np.asarray(self.vectors[index], dtype=np.float64) - self.global_weights


def distances(updates: Sequence[np.ndarray], center: np.ndarray) -> np.ndarray:
    """updates: k rows (n,) (a (k, n) array or ``Updates``), center (n,) -> ||x_i - center|| (k,), in float64; one
    row at a time."""
    return np.array([np.sqrt(np.square(update - center).sum()) for update in updates], dtype=np.float64)


def default_radius(updates: Sequence[np.ndarray], center: np.ndarray) -> float:
    """tau = RADIUS_FACTOR * median_i ||x_i - v_0||: honest results, whose distances are alike, pass unclipped,
    while one far away is cut down to twice the typical distance. Scale-free, so it needs no tuning."""
    return radius_of(distances(updates, center))


def radius_of(distances_from_center: np.ndarray) -> float:
    return RADIUS_FACTOR * float(np.median(distances_from_center))


def centered_clip(
    updates: Sequence[np.ndarray], center: np.ndarray, radius: float, iterations: int,
    weights: np.ndarray | None = None, *, first_norms: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """updates: k rows (n,) float64 (a (k, n) array or ``Updates``), center v_0: (n,), radius tau >= 0, L >= 1 ->
    (v_L (n,), clipped (k,) bool). ``first_norms``: ||x_i - v_0||, when the caller has them already.

    repeat L times:
        z_i = x_i - v                                   (k, n)
        s_i = min(1, tau / ||z_i||), 1 where z_i = 0    (k,)
        v   = v + sum_i(p_i * s_i * z_i)                (n,)   p_i = n_i / sum(n): the example shares
    clipped: ||z_i|| > tau in the last iteration

    Two passes over the rows an iteration (their norms, then the clipped sum), with memory for a few rows only; the
    sum adds the rows in order from zero, which is what numpy's sum over the rows of a (k, n) matrix does, so the
    result is the matrix form's to the bit.
    """
    count = len(updates)
    share = np.full(count, 1.0 / count) if weights is None else weights / weights.sum()
    v = center
    clipped = np.zeros(count, dtype=bool)
    for iteration in range(iterations):
        norms = first_norms if iteration == 0 and first_norms is not None else distances(updates, v)
        clipped = norms > radius
        scale = np.ones_like(norms)
        scale[clipped] = radius / norms[clipped]
        coefficients = share * scale
        step = np.zeros_like(v)
        for coefficient, update in zip(coefficients, updates, strict=True):
            step += coefficient * (update - v)
        v = v + step
    return v, clipped


@dataclass(eq=False)
class CenteredClipping(Aggregator):
    """Centered clipping (Karimireddy et al. 2021) on updates. Defaults: radius None (see below), iterations 1.

    ``radius`` (tau) in weight units; ``None`` picks it per round: twice the median distance of the
    round's updates from the starting point v_0. ``iterations`` is L. The mean step weighs each result by its
    example count (the relay's count, never a peer's claim), so with honest results nothing is clipped and the
    aggregate is FedAvg's weighted mean; with equal counts it is the paper's unweighted mean. (Unweighted, a
    round's one small unit, e.g. the corpus's short last chunk, weighed as much as a full one and could throw
    the model off.)
    ``last_outliers``: the results clipped in the last iteration (further than tau from v); ``last_radius``:
    the tau the last call used.
    State: ``center`` (float64, the last aggregated update v_L), absent before the first call. It is the
    starting point of the next call, so call ``reset`` when the global weights jump (a rollback, a new session).
    """

    radius: float | None = None
    iterations: int = 1
    center: np.ndarray | None = field(default=None, init=False, repr=False)
    last_radius: float | None = field(default=None, init=False)

    name: ClassVar[str] = "centered_clipping"
    is_stateful: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.radius is not None:
            self.radius = checked_number(self.name, "radius", self.radius, above=0)
        self.iterations = checked_integer(self.name, "iterations", self.iterations, at_least=1)

    def _combine(
        self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]
    ) -> tuple[np.ndarray, Outliers]:
        if self.streams():
            return self.combine_by_stream(global_weights, vectors, counts)
        center = self._center(global_weights)
        updates = Updates(vectors, global_weights)
        first_norms = distances(updates, center)
        radius = radius_of(first_norms) if self.radius is None else self.radius
        weights = np.asarray(counts, dtype=np.float64)
        v, clipped = centered_clip(updates, center, radius, self.iterations,
                                   weights if weights.sum() > 0 else None, first_norms=first_norms)
        self.center, self.last_radius = v, radius
        return global_weights + v, tuple(int(i) for i in np.flatnonzero(clipped))

    def _center(self, global_weights: np.ndarray) -> np.ndarray:
        center = np.zeros_like(global_weights) if self.center is None else self.center
        if center.shape != global_weights.shape:
            raise StateMismatch(
                f"centered_clipping center has {center.shape[0]} values, weights have {global_weights.shape[0]}"
            )
        return center

    def streams(self) -> bool:
        """One iteration (the default) streams: v_1 = v_0 + sum_i p_i clip(x_i - v_0) needs, per result, only its
        distance from v_0 (known when it arrives) and, once the radius is known, a second look at the results
        beyond it. More iterations go over every result again each time."""
        return self.iterations == 1

    def open_stream(self, global_weights: np.ndarray) -> Stream:
        if not self.streams():
            return super().open_stream(global_weights)
        return Stream(global_weights, self._center(global_weights))

    def finish_stream(self, stream: Stream, reread: Reread) -> tuple[np.ndarray, list[object]]:
        taking_part = stream.taking_part()
        if not taking_part:
            raise MergeError("a merge needs at least one result with examples")
        radius = radius_of(np.array([stream.distances[key] for key in taking_part])) if self.radius is None \
            else self.radius
        v, clipped = stream.clipped_mean(radius, reread)
        self.center, self.last_radius = v, radius
        return stream.global_weights + v, clipped

    def state_dict(self) -> StateDict:
        return {} if self.center is None else {"center": self.center.copy()}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        if set(state) - {"center"}:
            raise StateMismatch(f"centered_clipping state has only 'center' (after a call), got {sorted(state)}")
        center = checked_state_array(self.name, "center", state["center"]) if "center" in state else None
        self.reset()
        self.center = center

    def reset(self) -> None:
        super().reset()
        self.center, self.last_radius = None, None
