"""What a peer is handed (``Jobs``): an assignment as the job JSON of ``POST /api/work``, and the weights it
starts from as a wire message (``GET /api/weights``), encoded once per round."""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime import wire
from runtime.planner import Assignment
from server.relay.context import RelayContext


class Jobs:
    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self._weights: tuple[int, bytes] | None = None  # (round, message) of the current weights

    def job(self, assignment: Assignment, deadline: float) -> dict[str, Any]:
        """The job JSON of ``assignment``, leased until ``deadline`` (the store's clock)."""
        session, store = self.context.session, self.context.store
        unit = session.work_unit(assignment)
        return {**assignment.to_json(), "kind": session.task.kind, "episodes": unit.episodes,
                "progress": unit.progress,
                "lease_deadline": deadline, "lease_seconds": max(0.0, deadline - store.clock()),
                "weights_round": assignment.round, "num_rounds": session.num_rounds,
                "fingerprint": self.context.package.fingerprint,
                **({"carried_from": carried} if (carried := session.carried_from(assignment)) is not None else {}),
                **({"codec": codec.to_json()} if (codec := session.config.result_codec).compresses else {})}

    def weights_message(self) -> bytes:
        """The current round's weights as a wire message (cached until the round changes)."""
        session = self.context.session
        if self._weights is None or self._weights[0] != session.round:
            self._weights = (session.round, self.message(session.weights, session.round))
        return self._weights[1]

    def message(self, weights: np.ndarray, round_index: int) -> bytes:
        header = wire.WireHeader(spec=self.context.session.spec, round=round_index,
                                 fingerprint=self.context.package.fingerprint, num_examples=0)
        return wire.encode(weights, header)

    def forget(self) -> None:
        """A new session (or the last checkpoint reloaded): the cached message may be of other weights."""
        self._weights = None
