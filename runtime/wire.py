"""The wire codec: weights (and data chunks) as binary messages, never JSON arrays of numbers.

Weights message layout (all integers little-endian)::

    offset 0       4 bytes   magic b"PTW1"
    offset 4       4 bytes   uint32 H = length of the JSON header in bytes
    offset 8       H bytes   UTF-8 JSON header (an object, see ``WireHeader``)
    offset 8+H     P bytes   zero padding, P = (-(8 + H)) % 4, so the payload starts 4-byte aligned
    offset 8+H+P   4*N bytes the payload: N = spec.size float32 values, little-endian

The header object::

    {"spec": {"names": [...], "shapes": [[...], ...], "dtype": "float32"}, "round": 3,
     "fingerprint": "9f2c...", "num_examples": 1280, "metrics": {"loss": 2.1}, "meta": {...}}

Array messages (data chunks for browsers) use magic b"PTA1", the same framing, and the header
``{"dtype": "int32" | "float32", "shape": [...], "meta": {...}}``.

``decode`` checks everything a peer could get wrong and raises a ``WireError`` subclass whose
``code`` is short and machine-readable; the relay turns it into a 4xx response (``http_status``).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.weights import InvalidSpec, WeightSpec

WEIGHTS_MAGIC = b"PTW1"
ARRAY_MAGIC = b"PTA1"
PREAMBLE_BYTES = 8  # magic + uint32 header length
MAX_HEADER_BYTES = 4 * 1024 * 1024  # a spec with tens of thousands of entries still fits
ARRAY_DTYPES = {"int32": np.dtype("<i4"), "float32": np.dtype("<f4")}
WIRE_FLOAT32 = np.dtype("<f4")


class WireError(ValueError):
    """A message failed a check; ``code`` names the check, ``http_status`` suggests the relay's reply."""

    code = "wire_error"
    http_status = 400


class TruncatedMessage(WireError):
    code = "truncated"


class BadMagic(WireError):
    code = "bad_magic"


class HeaderLengthOutOfBounds(WireError):
    code = "header_length"


class MalformedHeader(WireError):
    code = "malformed_header"


class DtypeMismatch(WireError):
    code = "dtype_mismatch"


class LengthMismatch(WireError):
    code = "length_mismatch"


class ShapeMismatch(WireError):
    code = "shape_mismatch"
    http_status = 422


class NonFiniteWeights(WireError):
    code = "non_finite"
    http_status = 422


class StaleRound(WireError):
    code = "stale_round"
    http_status = 409


class FingerprintMismatch(WireError):
    code = "fingerprint_mismatch"
    http_status = 409


@dataclass(frozen=True)
class WireHeader:
    """What travels with a weight vector: its spec, which round and task it belongs to, and how it went."""

    spec: WeightSpec
    round: int
    fingerprint: str
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_json(),
            "round": self.round,
            "fingerprint": self.fingerprint,
            "num_examples": self.num_examples,
            "metrics": dict(self.metrics),
            "meta": dict(self.meta),
        }


# ---------------------------------------------------------------- framing shared by both message kinds


def _frame(magic: bytes, header: Mapping[str, Any], payload: bytes) -> bytes:
    try:
        header_bytes = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as error:  # NaN metric, or a meta value JSON cannot hold
        raise MalformedHeader(f"header cannot be written as strict JSON: {error}") from error
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise HeaderLengthOutOfBounds(f"header is {len(header_bytes)} bytes, the limit is {MAX_HEADER_BYTES}")
    padding = b"\x00" * (-(PREAMBLE_BYTES + len(header_bytes)) % 4)
    return magic + struct.pack("<I", len(header_bytes)) + header_bytes + padding + payload


def _unframe(data: bytes, magic: bytes) -> tuple[dict[str, Any], memoryview]:
    """Check magic, header length, JSON and padding; return (header object, payload bytes)."""
    view = memoryview(data).cast("B")
    if len(view) < PREAMBLE_BYTES:
        raise TruncatedMessage(f"message is {len(view)} bytes, shorter than the {PREAMBLE_BYTES}-byte preamble")
    if bytes(view[:4]) != magic:
        raise BadMagic(f"magic bytes are {bytes(view[:4])!r}, expected {magic!r}")
    (header_length,) = struct.unpack("<I", view[4:PREAMBLE_BYTES])
    if header_length > MAX_HEADER_BYTES:
        raise HeaderLengthOutOfBounds(f"header length {header_length} exceeds the limit of {MAX_HEADER_BYTES}")
    header_end = PREAMBLE_BYTES + header_length
    if header_end > len(view):
        raise HeaderLengthOutOfBounds(f"header length {header_length} runs past the end of a {len(view)}-byte message")
    try:
        header = json.loads(bytes(view[PREAMBLE_BYTES:header_end]).decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as error:
        raise MalformedHeader(f"header is not valid UTF-8: {error}") from error
    except json.JSONDecodeError as error:
        raise MalformedHeader(f"header is not valid JSON: {error}") from error
    except RecursionError as error:  # "[[[[..." a few thousand deep: json's parser gives up (it escaped as a 500)
        raise MalformedHeader("header is not valid JSON: it nests too deeply") from error
    if not isinstance(header, dict):
        raise MalformedHeader(f"header must be a JSON object, got {type(header).__name__}")
    payload_start = header_end + (-header_end % 4)
    if payload_start > len(view):
        raise LengthMismatch(f"message ends inside the padding after the header ({len(view)} bytes)")
    if any(view[header_end:payload_start]):
        raise MalformedHeader("padding after the header must be zero bytes")
    return header, view[payload_start:]


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; strict JSON (and the browser's JSON.parse) does not.
    raise MalformedHeader(f"header is not valid JSON: {name} is not a JSON value")


def _require(header: Mapping[str, Any], key: str, kind: type | tuple[type, ...], description: str) -> Any:
    if key not in header:
        raise MalformedHeader(f"header is missing required field {key!r}")
    value = header[key]
    if isinstance(value, bool) or not isinstance(value, kind):  # JSON true is not a round number
        raise MalformedHeader(f"header field {key!r} must be {description}, got {value!r}")
    return value


def _payload_values(payload: memoryview, dtype: np.dtype, count: int) -> np.ndarray:
    if len(payload) != dtype.itemsize * count:
        raise LengthMismatch(f"payload is {len(payload)} bytes, expected {dtype.itemsize * count} ({count} values)")
    if count == 0:
        return np.empty(0, dtype=dtype.newbyteorder("="))
    # astype: a writable copy in native byte order, independent of the message buffer
    return np.frombuffer(payload, dtype=dtype, count=count).astype(dtype.newbyteorder("="))


# ---------------------------------------------------------------- weights


def encode(vector: np.ndarray, header: WireHeader, *, check_finite: bool = True) -> bytes:
    """One weights message. ``check_finite=False`` exists only to build bad messages in tests."""
    vector = np.asarray(vector)
    if vector.ndim != 1 or vector.shape[0] != header.spec.size:
        raise LengthMismatch(f"vector has shape {list(vector.shape)}, spec needs {header.spec.size} values")
    if check_finite and not np.isfinite(vector).all():
        raise NonFiniteWeights(_non_finite_message(vector, header.spec))
    return _frame(WEIGHTS_MAGIC, header.to_json(), vector.astype(WIRE_FLOAT32).tobytes())


def decode(
    data: bytes,
    *,
    expect_spec: WeightSpec | None = None,
    expect_round: int | None = None,
    expect_fingerprint: str | None = None,
) -> tuple[WireHeader, np.ndarray]:
    """Check a weights message and return its header and a new float32 vector."""
    raw, payload = _unframe(data, WEIGHTS_MAGIC)
    header = _parse_weights_header(raw)
    if expect_fingerprint is not None and header.fingerprint != expect_fingerprint:
        raise FingerprintMismatch(f"result is for task {header.fingerprint!r}, this relay runs {expect_fingerprint!r}")
    if expect_round is not None and header.round != expect_round:
        raise StaleRound(f"result is for round {header.round}, the current round is {expect_round}")
    if expect_spec is not None:
        difference = expect_spec.first_difference(header.spec)
        if difference is not None:
            raise ShapeMismatch(f"weights do not match the model's spec: {difference}")
    vector = _payload_values(payload, WIRE_FLOAT32, header.spec.size)
    if not np.isfinite(vector).all():
        raise NonFiniteWeights(_non_finite_message(vector, header.spec))
    return header, vector


def _parse_weights_header(raw: Mapping[str, Any]) -> WireHeader:
    spec_json = _require(raw, "spec", dict, "an object")
    if "dtype" not in spec_json:
        raise MalformedHeader("header field 'spec' is missing 'dtype'")
    if spec_json["dtype"] != WeightSpec.dtype:
        raise DtypeMismatch(f"weights dtype is {spec_json['dtype']!r}; only 'float32' (little-endian) is accepted")
    try:
        spec = WeightSpec.from_json(spec_json)
    except InvalidSpec as error:
        raise MalformedHeader(f"header field 'spec' is invalid: {error}") from error
    round_index = _require(raw, "round", int, "a non-negative integer")
    num_examples = _require(raw, "num_examples", int, "a non-negative integer")
    for key, value in (("round", round_index), ("num_examples", num_examples)):
        if value < 0:
            raise MalformedHeader(f"header field {key!r} must be a non-negative integer, got {value}")
    fingerprint = _require(raw, "fingerprint", str, "a string")
    metrics = _require(raw, "metrics", dict, "an object of numbers")
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MalformedHeader(f"metric {name!r} must be a number, got {value!r}")
    meta = raw.get("meta", {})
    if not isinstance(meta, dict):
        raise MalformedHeader(f"header field 'meta' must be an object, got {meta!r}")
    return WireHeader(
        spec=spec,
        round=round_index,
        fingerprint=fingerprint,
        num_examples=num_examples,
        metrics={name: float(value) for name, value in metrics.items()},
        meta=meta,
    )


def _non_finite_message(vector: np.ndarray, spec: WeightSpec) -> str:
    bad = ~np.isfinite(vector)
    first = int(np.argmax(bad))
    return (
        f"{int(bad.sum())} of {vector.shape[0]} weights are not finite; "
        f"the first is {vector[first]} in entry {spec.entry_at(first)!r}"
    )


# ---------------------------------------------------------------- arrays (data chunks)


def encode_array(array: np.ndarray, *, meta: Mapping[str, Any] | None = None) -> bytes:
    """One array message for an int32 or float32 array of any shape (e.g. a chunk of token ids)."""
    array = np.asarray(array)
    dtype_name = {np.dtype(np.int32): "int32", np.dtype(np.float32): "float32"}.get(array.dtype.newbyteorder("="))
    if dtype_name is None:
        raise DtypeMismatch(f"array dtype is {array.dtype}; only int32 and float32 travel on the wire")
    header = {"dtype": dtype_name, "shape": list(array.shape), "meta": dict(meta or {})}
    return _frame(ARRAY_MAGIC, header, np.ascontiguousarray(array, dtype=ARRAY_DTYPES[dtype_name]).tobytes())


def decode_array(data: bytes, *, expect_dtype: str | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """Check an array message and return its ``meta`` and a new array (native byte order)."""
    raw, payload = _unframe(data, ARRAY_MAGIC)
    dtype_name = _require(raw, "dtype", str, "a string")
    if dtype_name not in ARRAY_DTYPES:
        raise DtypeMismatch(f"array dtype is {dtype_name!r}; only 'int32' and 'float32' are accepted")
    if expect_dtype is not None and dtype_name != expect_dtype:
        raise DtypeMismatch(f"array dtype is {dtype_name!r}, expected {expect_dtype!r}")
    shape = _require(raw, "shape", list, "a list of non-negative integers")
    if not all(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in shape):
        raise MalformedHeader(f"header field 'shape' must be a list of non-negative integers, got {shape!r}")
    meta = raw.get("meta", {})
    if not isinstance(meta, dict):
        raise MalformedHeader(f"header field 'meta' must be an object, got {meta!r}")
    count = math.prod(shape)  # Python int: a hostile shape cannot overflow it
    values = _payload_values(payload, ARRAY_DTYPES[dtype_name], count)
    if dtype_name == "float32" and not np.isfinite(values).all():
        raise NonFiniteWeights(f"{int((~np.isfinite(values)).sum())} of {count} array values are not finite")
    return meta, values.reshape(shape)
