"""Named model weights <-> one flat float32 vector.

A model's ``state_dict()`` is an ordered mapping ``name -> array`` in registration order. The relay,
the merge methods and the wire codec work on one flat float32 vector instead; a ``WeightSpec``
(names and shapes, in order) is the key that turns one into the other and back.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

Shape = tuple[int, ...]

FINGERPRINT_HEX_CHARS = 16  # 64 bits of sha256: plenty to tell two specs apart, short enough to log


class InvalidSpec(ValueError):
    """A weight spec (or its JSON form) is malformed: bad name, bad shape, duplicate name, wrong dtype."""


class SpecMismatch(ValueError):
    """Arrays or a vector do not fit a weight spec; the message names the offending entry."""


@dataclass(frozen=True)
class WeightSpec:
    """Ordered names and shapes of a model's weights. The dtype is always float32."""

    entries: tuple[tuple[str, Shape], ...]
    dtype: ClassVar[str] = "float32"

    def __post_init__(self) -> None:
        normalized: list[tuple[str, Shape]] = []
        seen: set[str] = set()
        for entry in self.entries:
            if not (isinstance(entry, tuple | list) and len(entry) == 2):
                raise InvalidSpec(f"spec entry {entry!r} is not a (name, shape) pair")
            name, shape = entry
            if not isinstance(name, str) or not name:
                raise InvalidSpec(f"spec entry name {name!r} is not a non-empty string")
            if name in seen:
                raise InvalidSpec(f"spec entry {name!r} appears twice")
            seen.add(name)
            normalized.append((name, _checked_shape(name, shape)))
        object.__setattr__(self, "entries", tuple(normalized))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.entries)

    @property
    def shapes(self) -> tuple[Shape, ...]:
        return tuple(shape for _, shape in self.entries)

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        """Start of each entry in the flat vector; one more element than entries (the last is ``size``)."""
        starts = [0]
        for shape in self.shapes:
            starts.append(starts[-1] + math.prod(shape))
        return tuple(starts)

    @property
    def size(self) -> int:
        """Number of float32 values in the flat vector."""
        return self.offsets[-1]

    def entry_at(self, flat_index: int) -> str:
        """Name of the entry that owns position ``flat_index`` of the flat vector."""
        if not 0 <= flat_index < self.size:
            raise IndexError(f"flat index {flat_index} outside a vector of {self.size} values")
        for name, start, stop in zip(self.names, self.offsets, self.offsets[1:], strict=False):
            if start <= flat_index < stop:
                return name
        raise AssertionError("unreachable: offsets cover the whole vector")

    def to_json(self) -> dict[str, Any]:
        """JSON-able form: ``{"names": [...], "shapes": [[...], ...], "dtype": "float32"}``."""
        return {"names": list(self.names), "shapes": [list(shape) for shape in self.shapes], "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WeightSpec:
        if not isinstance(data, Mapping):
            raise InvalidSpec(f"spec must be a JSON object, got {type(data).__name__}")
        missing = [key for key in ("names", "shapes", "dtype") if key not in data]
        if missing:
            raise InvalidSpec(f"spec is missing {', '.join(missing)}")
        names, shapes, dtype = data["names"], data["shapes"], data["dtype"]
        if dtype != cls.dtype:
            raise InvalidSpec(f"spec dtype is {dtype!r}; only {cls.dtype!r} is supported")
        if not isinstance(names, list) or not isinstance(shapes, list):
            raise InvalidSpec("spec names and shapes must be JSON arrays")
        if len(names) != len(shapes):
            raise InvalidSpec(f"spec has {len(names)} names but {len(shapes)} shapes")
        for name, shape in zip(names, shapes, strict=True):
            if not isinstance(shape, list):
                raise InvalidSpec(f"spec entry {name!r}: shape {shape!r} is not a JSON array")
        return cls(tuple((name, tuple(shape)) for name, shape in zip(names, shapes, strict=True)))

    def canonical_json(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    def fingerprint(self) -> str:
        """Short sha256 hex of the canonical JSON: equal specs, equal fingerprints."""
        return hashlib.sha256(self.canonical_json().encode("ascii")).hexdigest()[:FINGERPRINT_HEX_CHARS]

    def first_difference(self, other: WeightSpec) -> str | None:
        """Human-readable description of the first entry where ``other`` differs, or None if equal."""
        for index, (mine, theirs) in enumerate(zip(self.entries, other.entries, strict=False)):
            if mine != theirs:
                return f"entry {index}: expected {mine[0]!r} {list(mine[1])}, got {theirs[0]!r} {list(theirs[1])}"
        if len(self.entries) != len(other.entries):
            return f"expected {len(self.entries)} entries, got {len(other.entries)}"
        return None


def _checked_shape(name: str, shape: Any) -> Shape:
    if not isinstance(shape, tuple | list):
        raise InvalidSpec(f"spec entry {name!r}: shape {shape!r} is not a sequence")
    for dim in shape:
        # bool is an int subclass; True as a dimension is a bug, not a 1.
        if not isinstance(dim, int | np.integer) or isinstance(dim, bool) or dim < 0:
            raise InvalidSpec(f"spec entry {name!r}: dimension {dim!r} is not a non-negative integer")
    return tuple(int(dim) for dim in shape)


def spec_of(params: Mapping[str, Any]) -> WeightSpec:
    """The spec of an ordered mapping ``name -> array`` (e.g. a model's ``state_dict()``), in its order."""
    return WeightSpec(tuple((name, tuple(np.shape(array))) for name, array in params.items()))


def flatten(params: Mapping[str, Any], spec: WeightSpec) -> np.ndarray:
    """Concatenate ``params`` in spec order into a new 1-D float32 vector of ``spec.size`` values."""
    missing = [name for name in spec.names if name not in params]
    if missing:
        raise SpecMismatch(f"weights are missing entry {missing[0]!r} (missing {len(missing)} of {len(spec.names)})")
    known = set(spec.names)
    extra = [name for name in params if name not in known]
    if extra:
        raise SpecMismatch(f"weights have entry {extra[0]!r} that the spec does not list")
    vector = np.empty(spec.size, dtype=np.float32)
    for name, shape, start, stop in zip(spec.names, spec.shapes, spec.offsets, spec.offsets[1:], strict=False):
        array = np.asarray(params[name])
        if array.shape != shape:
            raise SpecMismatch(f"entry {name!r} has shape {list(array.shape)}, spec says {list(shape)}")
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise SpecMismatch(f"entry {name!r} has dtype {array.dtype}, expected a real number type")
        vector[start:stop] = array.reshape(-1)
    return vector


def unflatten(vector: np.ndarray, spec: WeightSpec, *, copy: bool = False) -> dict[str, np.ndarray]:
    """Split a flat vector into ``name -> array`` in spec order.

    The arrays are float32 views into ``vector`` when it already is a float32 vector (changes show
    through both ways); pass ``copy=True`` for independent arrays.
    """
    vector = np.asarray(vector)
    if vector.ndim != 1:
        raise SpecMismatch(f"expected a 1-D vector, got shape {list(vector.shape)}")
    if vector.shape[0] != spec.size:
        raise SpecMismatch(f"vector has {vector.shape[0]} values, spec needs {spec.size}")
    if vector.dtype != np.float32 or copy:
        vector = vector.astype(np.float32)  # always a copy
    return {
        name: vector[start:stop].reshape(shape)
        for name, shape, start, stop in zip(spec.names, spec.shapes, spec.offsets, spec.offsets[1:], strict=False)
    }
