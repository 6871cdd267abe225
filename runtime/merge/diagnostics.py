"""What a round's change looks like to the server optimizer: the numbers each history entry keeps.

``delta`` is the round's pseudo-gradient in Reddi et al.'s sign convention: the aggregator's average minus the
global weights (what the peers moved, before the server optimizer acts on it). Read them this way:

* ``pseudo_gradient_norm`` and ``step_norm`` (the global weights' actual move): their ratio is the server
  optimizer's effective step (1 for FedAvg; momentum and Adam make it larger or smaller).
* ``cosine_previous``: the cosine with the previous round's delta. Near 1, rounds agree and momentum builds
  up a longer step; near 0 or below, rounds disagree and momentum overshoots (heavy ball on noise).
* ``tensor_rms`` (min, median, max of each weight tensor's root-mean-square delta) and ``spread`` (their
  coefficient of variation): server Adam rescales per coordinate, so when every tensor moves at the same scale
  it has little to rescale and acts like a sign step; a large spread is where it can help.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.weights import WeightSpec


def cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    """cos(a, b) in float64, or None when either vector is zero."""
    norms = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
    return float(np.dot(a, b)) / norms if norms > 0 else None


def round_diagnostics(delta: np.ndarray, previous: np.ndarray | None, step: np.ndarray,
                      spec: WeightSpec | None = None) -> dict[str, Any]:
    """The history's ``diagnostics`` for one round (see the module docstring); ``previous``: the last round's
    delta, None for the first round (and the first after a restart: it is not kept in checkpoints)."""
    delta = np.asarray(delta, dtype=np.float64)
    out: dict[str, Any] = {"pseudo_gradient_norm": float(np.linalg.norm(delta)),
                           "step_norm": float(np.linalg.norm(np.asarray(step, dtype=np.float64))),
                           "cosine_previous": cosine(delta, previous) if previous is not None else None}
    if spec is not None and spec.size == delta.size and len(spec.names) > 0:
        rms = np.array([np.sqrt(np.mean(delta[start:stop] ** 2)) if stop > start else 0.0
                        for start, stop in zip(spec.offsets, spec.offsets[1:], strict=False)])
        mean = float(rms.mean())
        out["tensor_rms"] = {"min": float(rms.min()), "median": float(np.median(rms)), "max": float(rms.max()),
                             "largest": spec.names[int(rms.argmax())]}
        out["spread"] = float(rms.std() / mean) if mean > 0 else 0.0
    return out
