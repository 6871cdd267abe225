"""What the device chooser times: a probe builds a task's own kind of update on the active backend.

A `Probe` is called once per backend with that backend active; it builds the model, optimizer and data there
and returns a `Step`, an awaitable training step returning its loss. Tasks make their probes
(`runtime.tasks.base.Task.device_probe`); `runtime.device` only times them, so it knows no task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

Step = Callable[[], Awaitable[float]]  # one training step on the active backend; returns the loss
Probe = Callable[[], Step]  # builds model, optimizer and data on the active backend; returns its step


class Rebuildable(Protocol):
    """A model that can be rebuilt from its config and a seed (Transformer, MLPPolicy)."""

    config: Any

    def __init__(self, config: Any, seed: int = 0) -> None: ...
    def state_dict(self) -> dict[str, np.ndarray]: ...
    def load_state_dict(self, state: dict[str, np.ndarray]) -> None: ...



async def read_back(backend: Any, *arrays: Any) -> list[np.ndarray]:
    """The step's one read-back: one awaited buffer mapping on WebGPU, plain arrays on numpy."""
    read = getattr(backend, "read", None)
    if read is not None:
        return list(await read(*arrays))
    return [np.asarray(backend.to_numpy(x)) for x in arrays]


def copier[ModelT: Rebuildable](model: ModelT, seed: int) -> Callable[[], ModelT]:
    """A builder of fresh copies of ``model`` (same class and config, its weights as they are now) on whichever
    backend is active when called, so every backend a probe runs on starts from the same weights."""
    state = model.state_dict()
    config = model.config
    kind = type(model)

    def build() -> ModelT:
        copy = kind(config, seed)
        copy.load_state_dict(state)  # same weights on every backend
        return copy

    return build
