"""Array messages: the data chunks a package holds and browsers fetch (``runtime.wire``'s framing, magic b"PTA2",
and a version 1 b"PTA1" still read), one int32 or float32 array of any shape each with its ``meta``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from runtime import wire

ARRAY_DTYPES = {"int32": np.dtype("<i4"), "float32": np.dtype("<f4")}


def encode_array(array: np.ndarray, *, meta: Mapping[str, Any] | None = None) -> bytes:
    """One array message for an int32 or float32 array of any shape (e.g. a chunk of token ids)."""
    array = np.asarray(array)
    dtype_name = {np.dtype(np.int32): "int32", np.dtype(np.float32): "float32"}.get(array.dtype.newbyteorder("="))
    if dtype_name is None:
        raise wire.DtypeMismatch(f"array dtype is {array.dtype}; only int32 and float32 travel on the wire")
    header = {"dtype": dtype_name, "shape": list(array.shape), "meta": dict(meta or {})}
    return wire._frame(wire.ARRAY_MAGIC, header, np.ascontiguousarray(array, dtype=ARRAY_DTYPES[dtype_name]).tobytes())


def decode_array(data: bytes, *, expect_dtype: str | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """Check an array message and return its ``meta`` and a new array (native byte order)."""
    raw, payload = wire._unframe(data, wire.ARRAY_MAGIC)
    dtype_name = wire._require(raw, "dtype", str, "a string")
    if dtype_name not in ARRAY_DTYPES:
        raise wire.DtypeMismatch(f"array dtype is {dtype_name!r}; only 'int32' and 'float32' are accepted")
    if expect_dtype is not None and dtype_name != expect_dtype:
        raise wire.DtypeMismatch(f"array dtype is {dtype_name!r}, expected {expect_dtype!r}")
    shape = wire._require(raw, "shape", list, "a list of non-negative integers")
    if not all(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in shape):
        raise wire.MalformedHeader(f"header field 'shape' must be a list of non-negative integers, got {shape!r}")
    meta = raw.get("meta", {})
    if not isinstance(meta, dict):
        raise wire.MalformedHeader(f"header field 'meta' must be an object, got {meta!r}")
    count = math.prod(shape)  # Python int: a hostile shape cannot overflow it
    values = wire._payload_values(payload, ARRAY_DTYPES[dtype_name], count)
    if dtype_name == "float32" and not np.isfinite(values).all():
        raise wire.NonFiniteWeights(f"{int((~np.isfinite(values)).sum())} of {count} array values are not finite")
    return meta, values.reshape(shape)
