"""Simulated peers' uploads: a result as the relay receives it in the session's codec (``runtime.codec``).

A browser peer sends its update compressed (int8, or topk with its own error-feedback residual); the relay adds the
decoded update to the round's weights. The simulator trains every unit in-process and passes each result through
the same codec the same way, so a simulated session merges what a browser session would. A simulated peer is a
slot: the peer of slot s trains slot s of every round and keeps its own residual (``peer`` overrides, as local-data
simulation does)."""

from __future__ import annotations

from runtime.codecs import ErrorFeedback, arrived
from runtime.planner import Assignment
from runtime.tasks import UnitResult
from server.session.session import Session


class SimulatedUploads:
    def __init__(self) -> None:
        self.feedback: dict[int, ErrorFeedback] = {}  # simulated peer -> its residual

    def arrived(self, session: Session, assignment: Assignment, result: UnitResult,
                peer: int | None = None) -> UnitResult:
        """``result`` (trained from the session's weights) as the relay would merge it."""
        codec = session.config.result_codec
        if not codec.compresses:
            return result
        feedback = self.feedback.setdefault(assignment.slot if peer is None else peer,
                                            ErrorFeedback(session.spec.size))
        weights = arrived(codec, session.weights, result.weights, assignment.unit_seed, feedback)
        return UnitResult(weights, result.num_examples, result.metrics)
