"""Buffered asynchronous merging (FedBuff: Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous
Aggregation"), the parts the relay and the simulator share.

In ``serve --mode async`` a peer always gets a unit at once, with the newest weights version. Its result is
an update from the version it started from, ``v``. It is merged with the next K results into version M + 1
(from version M), ``s = M - v`` versions stale, and the merge sees it as

    effective = w_M + (1 + s) ** -a * (result - w_v)

(an update message carries ``result - w_v``; for a weights message the relay keeps it from when the result came,
so it needs no old weights at the merge, nor after a restart). Every K accepted results,
``Session.complete_buffer`` merges the buffer through the same aggregator and server optimizer as a synchronous
round (FedAvg of the effective results steps by the staleness-weighted mean update). The units are the plan's
schedule, handed out in order, each once per pass. The relay records each result's version and its arrival;
``replay`` feeds those records to a fresh session and reaches the same weights bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime import wire
from runtime.codecs import Codec
from runtime.planner import Assignment, unit_seed
from runtime.tasks import UnitResult


def staleness_weight(staleness: int, exponent: float) -> float:
    """``(1 + s) ** -a``: 1 for a result from the newest weights, less the further behind it started."""
    if staleness < 0:
        raise ValueError(f"staleness must be 0 or more, got {staleness}")
    return float((1.0 + staleness) ** -exponent)


def update_from(result: np.ndarray, base: np.ndarray) -> np.ndarray:
    """What a result changed from the weights it started from (float32, as the relay stores it)."""
    return (result.astype(np.float64) - base.astype(np.float64)).astype(np.float32)


def update_of(message: bytes, weights: np.ndarray, base: np.ndarray, codec: Codec) -> np.ndarray:
    """A result's update as the relay keeps and merges it: what an update message carries, else ``update_from``
    the base it started from."""
    return wire.carried_update(message, codec) if wire.is_update(message) else update_from(weights, base)


def stored_update(message: bytes, update: bytes, codec: Codec) -> np.ndarray:
    """A buffered result's update as the relay merges it: an update message (a codec's: int8, topk) carries it, and
    the relay keeps only the message; a weights message's update (``update_from`` its base) is kept beside it,
    ``update``, since the base may be gone when it merges (a restart keeps only the newest weights)."""
    if wire.is_update(message):
        return wire.carried_update(message, codec)
    return np.frombuffer(update, dtype=np.float32)


def effective_weights(current: np.ndarray, update: np.ndarray, staleness: int, exponent: float) -> np.ndarray:
    """A result as its merge sees it: ``current + (1 + s) ** -a * update``, in float64, stored float32. ``current``
    may be the float64 copy of the weights a merge holds already (the same values: the same bits, one pass less)."""
    summed = np.multiply(update, staleness_weight(staleness, exponent), dtype=np.float64)
    summed += np.asarray(current, dtype=np.float64)
    return summed.astype(np.float32)


def entry_assignment(schedule: Sequence[tuple[int, int]], seed: int, entry: int, version: int) -> Assignment:
    """Entry ``entry`` of the plan's schedule as an assignment trained from weights ``version`` (its "round")."""
    pass_index, unit = schedule[entry]
    return Assignment(version, entry, pass_index, unit, unit_seed(seed, pass_index, unit))


@dataclass(frozen=True)
class Arrival:
    """One accepted result as the relay recorded it: which entry, from which version, into which merge."""

    seq: int
    entry: int
    unit_index: int
    version: int
    merge: int
    num_examples: int
    metrics: Mapping[str, Any]
    weights: np.ndarray  # what the peer uploaded


def replay(session: Any, arrivals: Iterable[Arrival], *, exponent: float, validate_every: int) -> Any:
    """Feed recorded arrivals (in arrival order) to ``session`` (fresh, same config): the same merges, the same
    weights. Keeps every version's weights a result started from."""
    versions = {0: session.weights.copy()}
    by_merge: dict[int, list[Arrival]] = {}
    for arrival in sorted(arrivals, key=lambda a: a.seq):
        by_merge.setdefault(arrival.merge, []).append(arrival)
    for merge in sorted(by_merge):
        if merge != session.round:
            raise ValueError(f"the recorded merges skip from {session.round} to {merge}")
        buffer = [(a.unit_index, UnitResult(effective_weights(session.weights, update_from(a.weights, versions[
            a.version]), merge - a.version, exponent), a.num_examples, dict(a.metrics))) for a in by_merge[merge]]
        session.complete_buffer(buffer, validate=validates(merge, validate_every, session.num_rounds))
        versions[session.round] = session.weights.copy()
    return session


def validates(merge: int, every: int, merges: int) -> bool:
    """Whether merge ``merge`` (from 0) is followed by a validation: every ``every`` merges, and the last."""
    return (merge + 1) % max(1, every) == 0 or merge + 1 >= merges
