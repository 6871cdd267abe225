"""The wire codec: weights (and data chunks) as binary messages, never JSON arrays of numbers.

Weights message layout, format version 2 (all integers little-endian)::

    offset 0        4 bytes   magic b"PTW2"
    offset 4        4 bytes   uint32 C = CRC-32 (``zlib.crc32``) of every byte from offset 8 to the end
    offset 8        4 bytes   uint32 H = length of the JSON header in bytes
    offset 12       H bytes   UTF-8 JSON header (an object, see ``WireHeader``)
    offset 12+H     P bytes   zero padding, P = (-(12 + H)) % 4, so the payload starts 4-byte aligned
    offset 12+H+P   4*N bytes the payload: N = spec.size float32 values, little-endian

The header object::

    {"spec": {"names": [...], "shapes": [[...], ...], "dtype": "float32"}, "round": 3,
     "fingerprint": "9f2c...", "num_examples": 1280, "metrics": {"loss": 2.1}, "meta": {...}}

Update messages (a result sent as its update, ``runtime.codec``) use magic b"PTU2", the same framing, the weights
header plus ``"codec": {"name": "int8", "block": 256}`` and ``"base"`` (``weights_digest`` of the weights the update
is against), and the codec's payload; ``result_weights`` turns either kind of result into the weights it stands for
(the base plus the decoded update, in float32).

Array messages (data chunks for browsers) use magic b"PTA2", the same framing, and the header
``{"dtype": "int32" | "float32", "shape": [...], "meta": {...}}`` (``runtime.wire_arrays``).

The checksum covers the header length, the header, the padding and the payload; nothing after it is read
before it matches (``ChecksumMismatch``), so a byte flipped, inserted or deleted in transit, or a message cut
short, is refused instead of decoding to other weights. CRC-32 catches every damage confined to the checksum
field or to 32 consecutive bits of what it covers, and misses a random other one with odds of about 2**-32.
It is not a signature: anyone can compute it (``reseal``).

Version 1 (b"PTW1" / b"PTA1") had no checksum: magic, uint32 H, header from offset 8, padding to 4, payload.
A version 1 *weights* message is refused (``OutdatedFormat``): weights only travel between a relay and its
peers, built from the same code, so one means the sender's runtime is out of date. A version 1 *array* is still
decoded, because packages built before version 2 hold their chunk files as PTA1 (``server.session.package``).
A damaged version 2 array cannot pass for a version 1 one with other contents. With its version byte changed to
"1" and bytes 4-11 intact, version 1 reads the checksum as the header length and the version 2 header length as
the start of the JSON; H <= 4 MiB < 2**24, so byte 11 is 0, a NUL never parses, and a header of 3 bytes or fewer
holds no ``dtype``: refused. A version 1 message appears only when the 4 checksum bytes are removed too, and
then it is the same array (same header and payload, same padding: 12 + H and 8 + H agree mod 4); other
contents take a third, independent damage on top of those two.

``decode`` checks everything a peer could get wrong and raises a ``WireError`` subclass whose
``code`` is short and machine-readable; the relay turns it into a 4xx response (``http_status``).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.codecs import Codec, CodecError
from runtime.codecs import from_json as codec_from_json
from runtime.weights import InvalidSpec, WeightSpec

WEIGHTS_MAGIC = b"PTW2"
UPDATE_MAGIC = b"PTU2"
ARRAY_MAGIC = b"PTA2"
PREAMBLE_BYTES = 12  # magic + uint32 checksum + uint32 header length
CHECKSUM_START = 8  # the checksum covers bytes [8, end): header length, header, padding, payload
OLD_WEIGHTS_MAGIC = b"PTW1"  # version 1: refused (``OutdatedFormat``)
OLD_ARRAY_MAGIC = b"PTA1"  # version 1: still decoded (chunk files of packages built before version 2)
OLD_PREAMBLE_BYTES = 8  # version 1: magic + uint32 header length
MAX_HEADER_BYTES = 4 * 1024 * 1024  # a spec with tens of thousands of entries still fits
WIRE_FLOAT32 = np.dtype("<f4")


class WireError(ValueError):
    """A message failed a check; ``code`` names the check, ``http_status`` suggests the relay's reply."""

    code = "wire_error"
    http_status = 400


class TruncatedMessage(WireError):
    code = "truncated"


class BadMagic(WireError):
    code = "bad_magic"


class OutdatedFormat(BadMagic):
    """A version 1 weights message: its sender's runtime predates the checksum (format version 2)."""

    code = "outdated_format"


class ChecksumMismatch(WireError):
    code = "checksum"


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


class WrongBase(WireError):
    """An update against other weights than the round's (its ``base`` digest differs)."""

    code = "wrong_base"
    http_status = 409


class WrongCodec(WireError):
    """A result in another codec than the session's, or an update whose payload does not decode."""

    code = "wrong_codec"
    http_status = 422


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
    covered = struct.pack("<I", len(header_bytes)) + header_bytes + padding
    checksum = zlib.crc32(payload, zlib.crc32(covered))  # (no copy of the payload just to checksum it)
    return magic + struct.pack("<I", checksum) + covered + payload


def reseal(data: bytes) -> bytes:
    """``data`` (a version 2 message, maybe altered) with its checksum recomputed: for tests and fuzzers that
    build bad messages by hand and want them to reach the checks behind the checksum. Shorter than a preamble:
    returned as it is."""
    if len(data) < PREAMBLE_BYTES:
        return bytes(data)
    return bytes(data[:4]) + struct.pack("<I", zlib.crc32(memoryview(data)[CHECKSUM_START:])) + bytes(
        data[CHECKSUM_START:])


def _unframe(data: bytes, magic: bytes) -> tuple[dict[str, Any], memoryview]:
    """Check magic, checksum, header length, JSON and padding; return (header object, payload bytes).

    ``magic`` is a version 2 magic; an array message of version 1 (no checksum) is read too."""
    view = memoryview(data).cast("B")
    if len(view) < 4:
        raise TruncatedMessage(f"message is {len(view)} bytes, shorter than the {PREAMBLE_BYTES}-byte preamble")
    found = bytes(view[:4])
    if found == magic:
        preamble = PREAMBLE_BYTES
    elif magic == ARRAY_MAGIC and found == OLD_ARRAY_MAGIC:
        preamble = OLD_PREAMBLE_BYTES
    elif magic == WEIGHTS_MAGIC and found == OLD_WEIGHTS_MAGIC:
        raise OutdatedFormat(f"this is a version 1 weights message ({found!r}, without a checksum); this runtime "
                             f"reads only version 2 ({magic!r}): the sending peer's runtime is out of date. Reload "
                             "the page (or reinstall peertrain) so that the relay and its peers run the same build")
    else:
        raise BadMagic(f"magic bytes are {found!r}, expected {magic!r}")
    if len(view) < preamble:
        raise TruncatedMessage(f"message is {len(view)} bytes, shorter than the {preamble}-byte preamble")
    if preamble == PREAMBLE_BYTES:
        (checksum,) = struct.unpack("<I", view[4:CHECKSUM_START])
        actual = zlib.crc32(view[CHECKSUM_START:])
        if actual != checksum:
            raise ChecksumMismatch(f"checksum of the {len(view)}-byte message is {actual:08x}, its preamble says "
                                   f"{checksum:08x}: the message was damaged or cut short on its way")
    (header_length,) = struct.unpack("<I", view[preamble - 4:preamble])
    if header_length > MAX_HEADER_BYTES:
        raise HeaderLengthOutOfBounds(f"header length {header_length} exceeds the limit of {MAX_HEADER_BYTES}")
    header_end = preamble + header_length
    if header_end > len(view):
        raise HeaderLengthOutOfBounds(f"header length {header_length} runs past the end of a {len(view)}-byte message")
    try:
        header = json.loads(bytes(view[preamble:header_end]).decode("utf-8"), parse_constant=_reject_constant)
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
    return _weights_of(*_unframe(data, WEIGHTS_MAGIC), expect_spec, expect_round, expect_fingerprint)


def _weights_of(raw: Mapping[str, Any], payload: memoryview, expect_spec: WeightSpec | None,
                expect_round: int | None, expect_fingerprint: str | None) -> tuple[WireHeader, np.ndarray]:
    header = _checked_header(raw, expect_spec, expect_round, expect_fingerprint)
    vector = _payload_values(payload, WIRE_FLOAT32, header.spec.size)
    if not np.isfinite(vector).all():
        raise NonFiniteWeights(_non_finite_message(vector, header.spec))
    return header, vector


def _checked_header(raw: Mapping[str, Any], expect_spec: WeightSpec | None, expect_round: int | None,
                    expect_fingerprint: str | None) -> WireHeader:
    header = _parse_weights_header(raw)
    if expect_fingerprint is not None and header.fingerprint != expect_fingerprint:
        raise FingerprintMismatch(f"result is for task {header.fingerprint!r}, this relay runs {expect_fingerprint!r}")
    if expect_round is not None and header.round != expect_round:
        raise StaleRound(f"result is for round {header.round}, the current round is {expect_round}")
    if expect_spec is not None:
        difference = expect_spec.first_difference(header.spec)
        if difference is not None:
            raise ShapeMismatch(f"weights do not match the model's spec: {difference}")
    return header


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


# ---------------------------------------------------------------- updates (a result as its compressed update)


def weights_sha256(weights: np.ndarray) -> str:
    """The name of a weights vector: the sha256 (hex) of its float32 little-endian bytes (``runtime.deltas``)."""
    return hashlib.sha256(np.ascontiguousarray(weights, dtype=WIRE_FLOAT32).tobytes()).hexdigest()


def weights_digest(weights: np.ndarray) -> str:
    """What names the weights an update is against: the first 16 hex digits of ``weights_sha256``."""
    return weights_sha256(weights)[:16]


def encode_update(payload: bytes, header: WireHeader, codec: Codec, base: str) -> bytes:
    """One update message: ``payload`` is ``codec.encode(update)``, ``base`` the ``weights_digest`` it is against."""
    return _frame(UPDATE_MAGIC, {**header.to_json(), "codec": codec.to_json(), "base": base}, payload)


def is_update(data: bytes) -> bool:
    return bytes(memoryview(data)[:4]) == UPDATE_MAGIC


def carried_update(data: bytes, codec: Codec) -> np.ndarray:
    """The float32 update an update message carries, decoded in ``codec`` without its base (a message already
    checked against its base by ``result_weights``: the relay's asynchronous buffer keeps only the message)."""
    raw, payload = _unframe(data, UPDATE_MAGIC)
    return np.asarray(codec.decode(payload, _parse_weights_header(raw).spec.size), dtype=np.float32)


SAME_WEIGHTS_FIELDS = ("spec", "codec", "base")  # the header fields that, with the payload, decide the weights


def same_weights(data: bytes, other: bytes) -> bool:
    """Whether two result messages stand for the same weights by their bytes alone, without decoding either: both
    weights messages, or both updates in one codec against one base, of one spec, with the same payload bytes. False
    says only that the bytes differ (two payloads may still decode alike: decode them to compare)."""
    magic = bytes(memoryview(data)[:4])
    if magic != bytes(memoryview(other)[:4]) or magic not in (UPDATE_MAGIC, WEIGHTS_MAGIC):
        return False
    raw, payload = _unframe(data, magic)
    other_raw, other_payload = _unframe(other, magic)
    return all(raw.get(key) == other_raw.get(key) for key in SAME_WEIGHTS_FIELDS) and payload == other_payload


def weights_identity(magic: bytes, raw: Mapping[str, Any], payload: memoryview) -> str:
    """A sha256 (hex) of what ``same_weights`` compares in an unframed result message: two messages with one identity
    are the same weights by their bytes (a different identity says only "decode them to compare", as False there)."""
    digest = hashlib.sha256(magic + json.dumps([raw.get(key) for key in SAME_WEIGHTS_FIELDS], sort_keys=True).encode())
    digest.update(payload)
    return digest.hexdigest()


def read_header(data: bytes) -> WireHeader:
    """The header of a result message of either kind (its checksum checked, its payload not decoded)."""
    raw, _ = _unframe(data, UPDATE_MAGIC if is_update(data) else WEIGHTS_MAGIC)
    return _parse_weights_header(raw)


@dataclass(frozen=True)
class ResultParts:
    """A result message read against its base (``result_parts``): its header, the weights it stands for, the update
    it carries (None: a weights message) and its ``weights_identity``."""

    header: WireHeader
    weights: np.ndarray
    update: np.ndarray | None
    identity: str


def result_weights(data: bytes, base: np.ndarray, *, codec: Codec, expect_spec: WeightSpec | None = None,
                   expect_round: int | None = None, expect_fingerprint: str | None = None,
                   base_sha256: str | None = None) -> tuple[WireHeader, np.ndarray]:
    """A result message of either kind as (header, the weights it stands for): a weights message decoded, or an
    update message checked against ``base`` (the weights of the round it names) and ``codec`` (the session's), and
    added to it in float32. A result in another codec than ``codec`` is refused (``WrongCodec``). ``base_sha256``:
    ``weights_sha256(base)`` where the caller has it (a relay names its weights once a round, not once a result)."""
    parts = result_parts(data, base, codec=codec, expect_spec=expect_spec, expect_round=expect_round,
                         expect_fingerprint=expect_fingerprint, base_sha256=base_sha256, identity=False)
    return parts.header, parts.weights


def result_parts(data: bytes, base: np.ndarray, *, codec: Codec, expect_spec: WeightSpec | None = None,
                 expect_round: int | None = None, expect_fingerprint: str | None = None,
                 base_sha256: str | None = None, identity: bool = True) -> ResultParts:
    """``result_weights`` with what the relay keeps of a result as it arrives, read from one pass over the message:
    the update an update message carries (not decoded again) and the message's ``weights_identity`` ("" without
    ``identity``), which a second copy of the unit is compared by."""
    if not is_update(data):
        if codec.compresses:
            raise WrongCodec(f"this session's results travel as {codec.name} updates, not as weights")
        raw, payload = _unframe(data, WEIGHTS_MAGIC)
        header, weights = _weights_of(raw, payload, expect_spec, expect_round, expect_fingerprint)
        return ResultParts(header, weights, None, weights_identity(WEIGHTS_MAGIC, raw, payload) if identity else "")
    raw, payload = _unframe(data, UPDATE_MAGIC)
    header = _checked_header(raw, expect_spec, expect_round, expect_fingerprint)
    try:
        sent = codec_from_json(raw.get("codec"))
    except CodecError as error:
        raise WrongCodec(f"the update's codec: {error}") from error
    if sent != codec:
        raise WrongCodec(f"the update is in {sent.to_json()}, this session's codec is {codec.to_json()}")
    digest = weights_digest(base) if base_sha256 is None else base_sha256[:16]
    if raw.get("base") != digest:
        raise WrongBase(f"the update is against weights {raw.get('base')!r}, round {header.round}'s are {digest!r}: "
                        "fetch the round's weights again")
    try:
        update = np.asarray(codec.decode(payload, header.spec.size), dtype=np.float32)
    except CodecError as error:
        raise WrongCodec(f"the update does not decode: {error}") from error
    weights = (np.asarray(base, dtype=np.float32) + update).astype(np.float32)
    if not np.isfinite(weights).all():
        raise NonFiniteWeights(_non_finite_message(weights, header.spec))
    return ResultParts(header, weights, update, weights_identity(UPDATE_MAGIC, raw, payload) if identity else "")
