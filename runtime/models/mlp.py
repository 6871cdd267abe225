"""A small multilayer perceptron policy (e.g. CartPole: 4 observations -> 2 action logits)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.autograd import Tensor, tensor
from runtime.backend import get_backend
from runtime.nn import Linear, Module, ModuleList


@dataclass
class MLPConfig:
    sizes: tuple[int, ...] = (4, 16, 2)  # input, hidden..., output

    def __post_init__(self) -> None:
        self.sizes = tuple(int(size) for size in self.sizes)
        if len(self.sizes) < 2 or min(self.sizes) < 1:
            raise ValueError(f"MLP sizes need an input and an output width, all positive; got {self.sizes}")

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MLPConfig:
        unknown = sorted(set(values) - {"sizes"})
        if unknown:
            raise ValueError(f"unknown MLPConfig field(s): {unknown}")
        return cls(sizes=tuple(values["sizes"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> MLPConfig:
        return cls.from_dict(json.loads(text))


class MLPPolicy(Module):
    """Linear layers with tanh between them; forward(observations (B, in)) -> logits (B, out).

    Initialised like torch.nn.Linear (uniform in +-1/sqrt(fan_in) for weights and biases) from `seed`.
    """

    def __init__(self, config: MLPConfig | None = None, seed: int = 0) -> None:
        super().__init__()
        self.config = config or MLPConfig()
        sizes = self.config.sizes
        self.layers = ModuleList(Linear(n_in, n_out) for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True))
        self.initialize(seed)

    def initialize(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        backend = get_backend()
        for layer in self.layers:
            assert isinstance(layer, Linear) and layer.bias is not None
            bound = 1.0 / math.sqrt(layer.weight.shape[1])
            for parameter in (layer.weight, layer.bias):
                values = rng.uniform(-bound, bound, size=parameter.shape)
                parameter.data = backend.from_numpy(values, parameter.dtype)
                parameter.grad = None

    def forward(self, observations: Any) -> Tensor:
        x = observations if isinstance(observations, Tensor) else tensor(np.asarray(observations, dtype=np.float64))
        layers = list(self.layers)
        for layer in layers[:-1]:
            x = layer(x).tanh()  # (B, hidden)
        return layers[-1](x)  # (B, out)


PRESETS: dict[str, MLPConfig] = {"4-16-2": MLPConfig(sizes=(4, 16, 2))}  # 4*16 + 16 + 16*2 + 2 = 114 weights


def preset(name: str, **overrides: Any) -> MLPConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown MLP preset {name!r}; known: {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)
