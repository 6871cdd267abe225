"""Error feedback: what a codec dropped from one update, added to the next before encoding (Stich et al. 2018,
"Sparsified SGD with memory"). Only a codec that declares ``needs_error_feedback`` (topk) uses it; for the others
the residual stays zero and an update is encoded as it is."""

from __future__ import annotations

import numpy as np

from runtime.codecs.base import Codec


class ErrorFeedback:
    """A peer's residual: what its codec dropped so far, added to its next update before encoding (kept in the
    worker's memory; a page also keeps it in IndexedDB across reloads). int8's error has mean zero by its stochastic
    rounding, so int8 keeps none; only a codec that drops whole entries does."""

    def __init__(self, size: int) -> None:
        self.residual = np.zeros(size, dtype=np.float32)

    def corrected(self, codec: Codec, update: np.ndarray) -> np.ndarray:
        """What ``codec`` encodes for ``update``: the update plus the residual where the codec feeds its error back."""
        return (np.asarray(update, dtype=np.float32) + self.residual) if codec.needs_error_feedback else update

    def encode(self, codec: Codec, update: np.ndarray, seed: int) -> tuple[bytes, np.ndarray]:
        """The payload of ``update`` plus the residual, and what it decodes to; the residual keeps the rest."""
        corrected = self.corrected(codec, update)
        payload = codec.encode(corrected, seed)
        decoded = codec.decode(payload, int(np.asarray(update).size))
        if codec.needs_error_feedback:
            self.residual = (corrected - decoded).astype(np.float32)
        return payload, decoded


def arrived(codec: Codec, base: np.ndarray, weights: np.ndarray, seed: int, feedback: ErrorFeedback) -> np.ndarray:
    """The weights a result trained to ``weights`` from ``base`` stands for once it reached the relay in ``codec``:
    what ``runtime.peer.Peer`` sends and the relay adds back (``runtime.wire.result_weights``), bit for bit."""
    base = np.asarray(base, dtype=np.float32)
    _, decoded = feedback.encode(codec, (np.asarray(weights, dtype=np.float32) - base).astype(np.float32), seed)
    return (base + decoded).astype(np.float32)
