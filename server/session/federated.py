"""Federated evaluation in the round loop: what peers of a local task report about the weights they were handed.

Each result of a local unit carries, in its metrics, the task's metrics of the round's global weights on the
peer's own held-out examples (``federated_<name>``, with ``federated_examples``: ``runtime.tasks.local``). A
round's history entry gets them combined as ``federated``::

    {"of_round": r, "metrics": {name: mean weighted by held-out examples}, "examples": N, "results": n}

``of_round`` r: the weights after r merged rounds (the ones round r started from; 0 = the initial weights), so a
round's federated metrics judge the model the round before it produced. The weight of a result is its held-out
count, at most the relay's example count of that result (a peer's claim is never worth more than its unit).

Where the host has no validation split (a local task whose package holds none) the session is judged by
federated evaluation: the best checkpoint is the global weights with the best federated metric (``best.round``
r - 1 for ``of_round`` r; None for the initial weights) and the divergence watch reads the same value, before the
round's merge: ``stop`` ends the session after the merge, ``rollback`` restores the best weights instead of the
merged ones. The last round's merged weights are never evaluated (no later round hands them out). The metrics
are the peers' own reports, which the relay cannot check; with host validation they are shown, never acted on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runtime.tasks import UnitResult
from runtime.tasks.local import FEDERATED_EXAMPLES, FEDERATED_PREFIX

Session = Any  # server.session.session.Session (which imports this module)


def summary(results: Sequence[UnitResult], of_round: int) -> dict[str, Any] | None:
    """The round's ``federated`` entry from its results' metrics (module docstring); None when none reports any."""
    totals: dict[str, float] = {}
    weights: dict[str, float] = {}
    examples, reporting = 0.0, 0
    for result in results:
        held = result.metrics.get(FEDERATED_EXAMPLES)
        if not isinstance(held, int | float) or not held > 0:
            continue
        weight = min(float(held), float(result.num_examples))
        reporting += 1
        examples += weight
        for key, value in result.metrics.items():
            if key.startswith(FEDERATED_PREFIX) and key != FEDERATED_EXAMPLES and isinstance(value, int | float):
                name = key.removeprefix(FEDERATED_PREFIX)
                totals.setdefault(name, 0.0)
                weights.setdefault(name, 0.0)
                if math.isfinite(value):  # (one peer's NaN is left out; NaN from every peer is NaN)
                    totals[name] += weight * float(value)
                    weights[name] += weight
    if not reporting:
        return None
    return {"of_round": of_round, "metrics": {name: totals[name] / weights[name] if weights[name] else math.nan
                                              for name in sorted(totals)},
            "examples": int(examples), "results": reporting}


def without_federated(result: UnitResult) -> UnitResult:
    """The result with its federated metrics left out (the history's ``train`` holds training metrics only)."""
    metrics = {k: v for k, v in result.metrics.items() if not k.startswith(FEDERATED_PREFIX)}
    return UnitResult(result.weights, result.num_examples, metrics)


def judge(session: Session, entry: dict[str, Any] | None) -> tuple[bool, dict[str, Any] | None]:
    """Before the round's merge, in a session without host validation: whether the weights the round started from
    are the best so far (the session's best is updated), or the divergence event they cause (module docstring)."""
    value = (entry or {}).get("metrics", {}).get(session.metric)
    if not isinstance(value, int | float):
        return False, None
    divergence = session._divergence(float(value))
    if divergence is not None:
        return False, {"type": "divergence", "reason": f"federated {divergence}",
                       "action": session.config.on_divergence}
    if session._better(float(value), session.best_metric):
        session.best_metric = float(value)
        session.best_round = session.round - 1 if session.round > 0 else None
        session.best_weights = session.weights.copy()
        return True, None
    return False, None


def apply_divergence(session: Session, entry: dict[str, Any], event: dict[str, Any]) -> None:
    """After the merge: stop the session, or put the best weights back in place of the merged ones."""
    if event["action"] == "rollback":
        session.roll_back()
        event["restored_round"] = session.best_round
    else:
        session.stopped = f"diverged in round {session.round}: {event['reason']}"
    entry["events"] = [*entry.get("events", []), event]


def mean_metrics(per_unit: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean of each numeric local metric the units reported (e.g. train_loss): a history entry's ``train``."""
    names = sorted({k for metrics in per_unit for k, v in metrics.items() if isinstance(v, int | float)})
    return {name: float(np.mean([m[name] for m in per_unit if name in m])) for name in names}
