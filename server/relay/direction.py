"""Suspicion by direction: where an update points, against where the session is going.

A host replay catches any wrong result it is given, but only the results it is given: every peer's first, a seeded
share, every N-th at the latest (``ReplayQueue``), and the suspects. A norm check (``server.relay.checks``) makes a
suspect of an update far longer than the round's others; this makes one of an update that points the wrong way,
whatever its length: its cosine with the mean of the round's other updates below a threshold
(``--verify-direction``), judged when it arrives (against the updates accepted before it) and again when the
round's last result is in (against all the others), or its cosine with the previous round's merged pseudo-gradient
(the aggregator's average minus the global weights, ``MergeMethod.last_delta``) below that threshold less a slack.
Such an update is always replayed, before its round merges. The inner-product manipulation of Xie et al. 2020
("Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product Manipulation"), ``global - eps x update``, has a
small norm and the opposite direction: the norm check passes it, this does not. A free-rider's update (the global
weights sent back) has no direction at all: a suspect too.

The threshold was measured on honest sessions (``peertrain bench direction``, BENCHMARKS.md "Honest update
directions"): on every task measured an honest update points with its round's others (+0.08 at the lowest:
bytetext, against a single other). So do the non-IID peers of the CSV example, each holding mostly one class (+0.30
at the lowest): what their updates share outweighs what their labels pull apart. (A local task's results are never
replayed; its figures say what honest non-IID peers look like.) Only the previous step is a poor reference at small
k: a round of three units moves the model little along the last round's step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Measured (BENCHMARKS.md, "Honest update directions"): an update whose cosine with the round's other updates is
# below this is replayed (honest: +0.08 at the lowest, bytetext's second arrival; inner_product: -0.18 at the highest)
DEFAULT_VERIFY_DIRECTION = 0.0
# Honest updates agree less with the previous round's step than with their own round's (arith at k = 3: down to
# -0.13, median +0.06): against it an update is a suspect only this far below the threshold.
PREVIOUS_STEP_SLACK = 0.25
DIRECTION = "direction"  # how a replay's reason begins when its result was a suspect by direction


def cosine(update: np.ndarray, reference: np.ndarray | None) -> float | None:
    """cos(update, reference) in float64; None without a reference (or a zero one); 0 for a zero update."""
    if reference is None:
        return None
    scale = float(np.linalg.norm(reference))
    if not scale > 0:
        return None
    length = float(np.linalg.norm(update))
    return float(np.dot(update, reference) / (length * scale)) if length > 0 else 0.0


@dataclass(frozen=True)
class Direction:
    """An update's cosines with the previous round's step and with the mean of the round's other updates (None:
    nothing to compare with: the first round, or the first result of a round), and whether it has no direction at
    all (a zero update: the global weights sent back, which no honest unit does)."""

    previous: float | None
    others: float | None
    empty: bool = False

    def lowest(self) -> float | None:
        known = [c for c in (self.previous, self.others) if c is not None]
        return min(known) if known else None

    def suspect(self, threshold: float) -> bool:
        """No direction, a cosine with the round's others below ``threshold``, or with the previous step below
        ``threshold - PREVIOUS_STEP_SLACK``."""
        return self.empty or (self.others is not None and self.others < threshold) or \
            (self.previous is not None and self.previous < threshold - PREVIOUS_STEP_SLACK)

    def describe(self) -> str:
        if self.empty:
            return f"{DIRECTION}: none (a zero update)"
        parts = [f"cosine {c:.2f} with {what}" for c, what in ((self.previous, "the previous round's step"),
                                                                 (self.others, "the round's other updates"))
                 if c is not None]
        return f"{DIRECTION}: " + ", ".join(parts)


def direction_of(update: np.ndarray, previous_step: np.ndarray | None, others: np.ndarray | None) -> Direction:
    """``update`` (result - global, float64) against the previous step and against ``others``, the sum of the
    round's other updates (it points where their mean does; None: no other update is in)."""
    return Direction(cosine(update, previous_step), cosine(update, others), not bool(np.any(update)))
