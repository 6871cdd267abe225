"""The one language-model training step, shared by the text tasks, the throughput bench and the device probe.

`lm_step` is forward, zero_grad, backward, optional clipping by global norm and the optimizer step; it returns
the loss as a Tensor and reads nothing back itself unless clipping on the host (the default) needs the norm.
`lm_step_async` is the same step for a GPU backend: clipping stays on the device and the loss is the step's
single read-back, awaited at the end.
"""

from __future__ import annotations

import numpy as np

from runtime.autograd import Tensor
from runtime.backend import get_backend
from runtime.device_probe import read_back
from runtime.models.transformer import Transformer
from runtime.optim import Optimizer, clip_grad_norm


def lm_step(model: Transformer, optimizer: Optimizer, inputs: np.ndarray, targets: np.ndarray, *, clip: float,
            on_device: bool = False) -> Tensor:
    """One step on (B, T) ``inputs`` and next-token ``targets`` (-100 where the loss does not look).

    ``clip > 0`` clips the gradients to that global norm first: with ``on_device`` the scale is computed and
    applied on the backend without a read-back (see `runtime.optim.clip_grad_norm`). Returns the loss Tensor
    (before the update).
    """
    _, loss = model(inputs, targets)
    assert loss is not None
    optimizer.zero_grad()
    loss.backward()
    if clip > 0:
        clip_grad_norm(model.parameters(), clip, on_device=on_device)
    optimizer.step()
    return loss


async def lm_step_async(model: Transformer, optimizer: Optimizer, tokens: np.ndarray, clip: float = 1.0) -> float:
    """`lm_step` on (B, T + 1) ``tokens`` with clipping on the device and one awaited read-back, the loss."""
    loss = lm_step(model, optimizer, tokens[:, :-1], tokens[:, 1:], clip=clip, on_device=True)
    (value,) = await read_back(get_backend(), loss.data)
    return float(value)
