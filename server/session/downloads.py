"""How a session's weights move after a merge when its results travel compressed: by a step its peers can download.

With ``--codec int8`` or ``topk`` the session does not take the merged weights as they come: it encodes the merged
step (merged minus the weights before) with the same codec, seeded by the round, and moves by exactly the decoded
step (``runtime.deltas.quantized_step``). A peer holding the weights before rebuilds the new ones bit for bit from the
step's payload, so the relay sends a chain of steps instead of the full float32 weights (``runtime.deltas``). The
global weights stay exact float32 in checkpoints and exports: they are whatever the steps added up to.

int8 rounds each entry stochastically (mean-zero error), so nothing is carried; a codec that declares
``needs_error_feedback`` (topk) keeps what a step dropped in a server-side residual, added to the next round's step
(the same error feedback a peer runs), kept in the checkpoint beside the merge method's state so a restart loses none
of it. A divergence rollback clears it with the rest of the server's state.

The simulator runs the same session code, so a simulated session's weights are the relay's, round for round.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.codecs import Codec, ErrorFeedback
from runtime.deltas import Step, StepLog, quantized_step, weights_sha256

STATE_PREFIX = "download."  # the residual's key in the checkpoint's server state
_STEP_STREAM = 0xD0D0  # the seed stream of the steps' stochastic rounding (units use their own, runtime.planner)


def step_seed(session_seed: int, round_index: int) -> int:
    """The seed of round ``round_index``'s step (32 bits, like a unit's)."""
    sequence = np.random.SeedSequence([session_seed, _STEP_STREAM, round_index])
    return int(sequence.generate_state(1, np.uint32)[0])


class Downloads:
    """The session's step codec, its residual (a codec with error feedback: topk) and the recent steps
    (``runtime.deltas.StepLog``) the relay builds chains from."""

    def __init__(self, codec: Codec, size: int, seed: int) -> None:
        self.codec, self.seed = codec, seed
        self.feedback = ErrorFeedback(size)
        self.log = StepLog(budget=4 * size)  # never keep more than one float32 vector's worth of steps

    @property
    def active(self) -> bool:
        return self.codec.compresses

    def apply(self, round_index: int, before: np.ndarray, merged: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """(the weights round ``round_index`` ends at, its history's ``download`` fields): the merged weights as they
        are when nothing is compressed, else ``before`` plus the decoded step."""
        if not self.active:
            return merged, {}
        applied, payload, error = quantized_step(self.codec, before, merged, step_seed(self.seed, round_index),
                                                 self.feedback)
        self.log.add(Step(round_index, weights_sha256(before), weights_sha256(applied), payload))
        return applied, {"codec": self.codec.name, "bytes": len(payload), "error": error}

    def reset(self) -> None:
        """A rollback to earlier weights: what the dropped steps left behind belongs to weights no longer served."""
        self.feedback.residual[:] = 0

    def state_dict(self) -> dict[str, Any]:
        return {STATE_PREFIX + "residual": self.feedback.residual.copy()} if self.codec.needs_error_feedback else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        residual = state.get(STATE_PREFIX + "residual")
        if residual is not None and np.asarray(residual).shape == self.feedback.residual.shape:
            self.feedback.residual = np.asarray(residual, dtype=np.float32).copy()


def split_download_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's server state as (the rest, the downloads' own)."""
    return ({k: v for k, v in state.items() if not k.startswith(STATE_PREFIX)},
            {k: v for k, v in state.items() if k.startswith(STATE_PREFIX)})
