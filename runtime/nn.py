"""Layers: a `Module` base that registers parameters and sub-modules, plus Linear, Embedding, LayerNorm, Dropout.

Parameters are created empty (zeros / ones) in the active default dtype; models initialise them from a seed.
`named_parameters()` yields them in registration order, recursing into sub-modules where they were assigned,
and lists a shared (tied) parameter once, under its first name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Self

import numpy as np

from runtime.autograd import Tensor, functional, get_default_dtype, tensor


class Parameter(Tensor):
    """A leaf Tensor that a Module registers and an optimizer updates."""

    __slots__ = ()

    def __init__(self, data: np.ndarray) -> None:
        # A private copy: optimizers update parameters in place.
        leaf = tensor(np.array(data, dtype=get_default_dtype(), copy=True))
        super().__init__(leaf.data, requires_grad=True)


class Module:
    """Base class: attributes holding a Parameter or a Module are registered in assignment order."""

    training: bool
    _children: dict[str, Parameter | Module]

    def __init__(self) -> None:
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        children = self.__dict__.get("_children")
        if children is None:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() before assigning")
        if isinstance(value, Parameter | Module):
            children[name] = value
        else:
            children.pop(name, None)
        object.__setattr__(self, name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def children(self) -> Iterator[tuple[str, Module]]:
        for name, child in self._children.items():
            if isinstance(child, Module):
                yield name, child

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        seen: set[int] = set()
        for name, parameter in self._named_parameters_with_duplicates(""):
            if id(parameter) not in seen:
                seen.add(id(parameter))
                yield name, parameter

    def _named_parameters_with_duplicates(self, prefix: str) -> Iterator[tuple[str, Parameter]]:
        for name, child in self._children.items():
            if isinstance(child, Parameter):
                yield prefix + name, child
            else:
                yield from child._named_parameters_with_duplicates(f"{prefix}{name}.")

    def parameters(self) -> list[Parameter]:
        return [parameter for _, parameter in self.named_parameters()]

    def num_parameters(self) -> int:
        return sum(int(np.prod(p.shape)) for p in self.parameters())

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter as numpy arrays, keyed by name, in registration order."""
        return {name: np.array(parameter.numpy(), copy=True) for name, parameter in self.named_parameters()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Copy `state` into the parameters (cast to their dtype); every key must match by name and shape."""
        own = dict(self.named_parameters())
        missing = [name for name in own if name not in state]
        unexpected = [name for name in state if name not in own]
        if missing:
            raise ValueError(f"load_state_dict: missing key {missing[0]!r} (missing: {missing})")
        if unexpected:
            raise ValueError(f"load_state_dict: unexpected key {unexpected[0]!r} (unexpected: {unexpected})")
        for name, parameter in own.items():
            value = np.asarray(state[name])
            if tuple(value.shape) != parameter.shape:
                raise ValueError(
                    f"load_state_dict: shape mismatch for key {name!r}: got {tuple(value.shape)}, "
                    f"expected {parameter.shape}"
                )
        for name, parameter in own.items():
            # A private copy: optimizers update parameters in place and must not write into the caller's arrays.
            parameter.data = tensor(np.array(state[name], copy=True), dtype=parameter.dtype).data
            parameter.grad = None

    def zero_grad(self) -> None:
        for parameter in self.parameters():
            parameter.grad = None

    def train(self, mode: bool = True) -> Self:
        object.__setattr__(self, "training", mode)
        for _, child in self.children():
            child.train(mode)
        return self

    def eval(self) -> Self:
        return self.train(False)


class ModuleList(Module):
    """An indexable list of sub-modules named "0", "1", ..."""

    def __init__(self, modules: Iterable[Module]) -> None:
        super().__init__()
        for i, module in enumerate(modules):
            setattr(self, str(i), module)

    def __iter__(self) -> Iterator[Module]:
        return (module for _, module in self.children())

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, index: int) -> Module:
        return list(self)[index]


class Linear(Module):
    """y = x @ weight.T + bias, weight (out_features, in_features) like torch.nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = Parameter(np.zeros((out_features, in_features)))
        self.bias = Parameter(np.zeros(out_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return functional.linear(x, self.weight, self.bias)


class Embedding(Module):
    """A lookup table weight (num_embeddings, embedding_dim) indexed by integer ids."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = Parameter(np.zeros((num_embeddings, embedding_dim)))

    def forward(self, ids: Any) -> Tensor:
        return functional.embedding(self.weight, ids)


class LayerNorm(Module):
    """Layer normalisation over the last axis, eps 1e-5, weight ones and (optional) bias zeros."""

    def __init__(self, width: int, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = Parameter(np.ones(width))
        self.bias = Parameter(np.zeros(width)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return functional.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    """Dropout with probability p drawing from `rng`; identity in eval mode or when p == 0."""

    def __init__(self, p: float, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.rng = rng

    def forward(self, x: Tensor) -> Tensor:
        return functional.dropout(x, self.p, self.rng, self.training)
