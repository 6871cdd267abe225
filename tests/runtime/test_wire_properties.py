"""Hypothesis properties of the wire codec (``runtime.wire``): what a damaged message can and cannot do.

Messages are drawn (specs, finite float32 weights, headers; int32 and float32 arrays) and then damaged: bytes
flipped, set, inserted or deleted anywhere, any number of times, or the message cut short. The properties:

* any damaged weights or array message raises the codec's own ``WireError``, never another exception (a relay
  would have turned that into a 500), or decodes to exactly the original: the same weights (bit for bit) and
  header, the same array and meta. Version 2 carries a CRC-32 over everything after it, so a damage the
  checksum does not see has odds of 2**-32; a message cut short, or grown at the end, always raises;
* a damage confined to 4 consecutive bytes of the checksum field, or of what it covers, is always a
  ``ChecksumMismatch`` (CRC-32 catches every burst of up to 32 bits), wherever it lands: header length,
  header, padding or payload. (A burst across the field's end can slip through: the checksum precedes the
  bytes it covers, so the two do not form one CRC codeword; such a damage still has odds of about 2**-32.)
* version 1 arrays (chunk files of old packages) are still read, without a checksum. A version 2 array with its
  version byte changed to "1", and one more damage anywhere, raises or is the very same array: it takes
  removing the 4 checksum bytes to make a version 1 message, and then it holds the same array (see the
  ``runtime.wire`` docstring); a version 1 weights message is always refused as outdated;
* any JSON at all in the header, with any payload and a right checksum, raises a ``WireError`` or decodes.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import wire, wire_arrays
from runtime.weights import WeightSpec

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NAMES = st.text(alphabet="abcdefghij_.0123456789", min_size=1, max_size=8).filter(lambda n: n[0].isalpha())
SHAPES = st.lists(st.integers(min_value=1, max_value=4), min_size=0, max_size=3).map(tuple)
SPECS = st.lists(st.tuples(NAMES, SHAPES), min_size=1, max_size=4, unique_by=lambda entry: entry[0]).map(
    lambda entries: WeightSpec(tuple(entries)))
FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)
JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | FLOATS | st.text(max_size=8)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


@st.composite
def weights_messages(draw: st.DrawFn) -> tuple[bytes, wire.WireHeader, np.ndarray]:
    spec = draw(SPECS)
    vector = np.array(draw(st.lists(FLOATS, min_size=spec.size, max_size=spec.size)), dtype=np.float32)
    header = wire.WireHeader(
        spec=spec, round=draw(st.integers(0, 10**6)), fingerprint=draw(st.text(alphabet="0123456789abcdef",
                                                                                min_size=1, max_size=16)),
        num_examples=draw(st.integers(0, 10**6)), metrics=draw(st.dictionaries(NAMES, FLOATS, max_size=3)),
        meta=draw(st.dictionaries(NAMES, JSON_SCALARS, max_size=2)))
    return wire.encode(vector, header), header, vector


@st.composite
def array_messages(draw: st.DrawFn) -> tuple[bytes, dict[str, Any], np.ndarray]:
    shape = draw(st.lists(st.integers(1, 5), min_size=0, max_size=3))
    count = int(np.prod(shape))
    array: np.ndarray
    if draw(st.booleans()):
        array = np.array(draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=count, max_size=count)),
                         dtype=np.int32).reshape(shape)
    else:
        array = np.array(draw(st.lists(FLOATS, min_size=count, max_size=count)), dtype=np.float32).reshape(shape)
    meta = draw(st.dictionaries(NAMES, JSON_SCALARS, max_size=2))
    return wire_arrays.encode_array(array, meta=meta), meta, array


# A damage: ("flip", position, bit), ("set", position, byte), ("insert", position, bytes), ("delete", position, n).
# Positions are fractions of the message's length at the time, so any length of message is reached everywhere.
POSITIONS = st.floats(min_value=0, max_value=1, exclude_max=True)
DAMAGES = st.one_of(
    st.tuples(st.just("flip"), POSITIONS, st.integers(0, 7)),
    st.tuples(st.just("set"), POSITIONS, st.integers(0, 255)),
    st.tuples(st.just("insert"), POSITIONS, st.binary(min_size=1, max_size=6)),
    st.tuples(st.just("delete"), POSITIONS, st.integers(1, 6)),
)


def damaged(message: bytes, damages: list[tuple[str, float, Any]], *, within: int | None = None) -> bytes:
    """``message`` with ``damages`` applied in turn; ``within``: positions only in [0, within) (one damage)."""
    data = bytearray(message)
    for kind, fraction, value in damages:
        span = len(data) if within is None else within
        at = min(int(fraction * span), span - 1) if span else 0
        if kind == "insert":
            data[at:at] = value
        elif not data:
            continue
        elif kind == "flip":
            data[at] ^= 1 << value
        elif kind == "set":
            data[at] = value
        else:
            del data[at:at + (value if within is None else min(value, within - at))]
    return bytes(data)


def sealed(magic: bytes, header: bytes, payload: bytes) -> bytes:
    """A version 2 message built by hand, with a right checksum (so that the checks behind it are reached)."""
    covered = struct.pack("<I", len(header)) + header + b"\0" * (-(wire.PREAMBLE_BYTES + len(header)) % 4) + payload
    return magic + struct.pack("<I", zlib.crc32(covered)) + covered


def old_array(header: bytes, payload: bytes) -> bytes:
    """A version 1 array message (no checksum, the header at offset 8)."""
    return wire.OLD_ARRAY_MAGIC + struct.pack("<I", len(header)) + header + b"\0" * (-(8 + len(header)) % 4) + payload


def decode_or_wire_error(data: bytes, **expected: Any) -> tuple[wire.WireHeader, np.ndarray] | None:
    """The decoded message, or None for a WireError; any other exception fails the test."""
    try:
        return wire.decode(data, **expected)
    except wire.WireError:
        return None


def decode_array_or_wire_error(data: bytes) -> tuple[dict[str, Any], np.ndarray] | None:
    try:
        return wire_arrays.decode_array(data)
    except wire.WireError:
        return None


def expectations(header: wire.WireHeader) -> dict[str, Any]:
    """What the relay's decode of a result expects (``server.relay.checks.decode_result``)."""
    return {"expect_spec": header.spec, "expect_round": header.round, "expect_fingerprint": header.fingerprint}


def assert_same_weights(decoded: tuple[wire.WireHeader, np.ndarray] | None, header: wire.WireHeader,
                        vector: np.ndarray) -> None:
    if decoded is not None:
        assert decoded[0] == header
        assert decoded[1].dtype == np.float32 and decoded[1].tobytes() == vector.tobytes()


def assert_same_array(decoded: tuple[dict[str, Any], np.ndarray] | None, meta: dict[str, Any],
                      array: np.ndarray) -> None:
    if decoded is not None:
        assert decoded[0] == meta
        assert decoded[1].dtype == array.dtype and decoded[1].shape == array.shape
        assert decoded[1].tobytes() == array.tobytes()


@PROPERTY_SETTINGS
@given(weights_messages(), st.lists(DAMAGES, min_size=1, max_size=6), st.booleans())
def test_a_damaged_weights_message_raises_a_wire_error_or_decodes_to_the_original(
        drawn: tuple[bytes, wire.WireHeader, np.ndarray], damages: list, expect: bool) -> None:
    message, header, vector = drawn
    data = damaged(message, damages)
    assert_same_weights(decode_or_wire_error(data, **(expectations(header) if expect else {})), header, vector)


@PROPERTY_SETTINGS
@given(array_messages(), st.lists(DAMAGES, min_size=1, max_size=6))
def test_a_damaged_array_message_raises_a_wire_error_or_decodes_to_the_original(
        drawn: tuple[bytes, dict[str, Any], np.ndarray], damages: list) -> None:
    message, meta, array = drawn
    assert_same_array(decode_array_or_wire_error(damaged(message, damages)), meta, array)


@PROPERTY_SETTINGS
@given(weights_messages(), array_messages(), st.data())
def test_a_message_cut_short_or_grown_at_the_end_raises(weights: tuple[bytes, wire.WireHeader, np.ndarray],
                                                        array: tuple[bytes, dict[str, Any], np.ndarray],
                                                        data: st.DataObject) -> None:
    for message, decode in ((weights[0], wire.decode), (array[0], wire_arrays.decode_array)):
        cut = data.draw(st.integers(0, len(message) - 1), label="cut")
        try:
            decode(message[:cut])
        except wire.WireError:
            pass
        else:
            raise AssertionError(f"a message cut to {cut} of {len(message)} bytes decoded")
        grown = message + data.draw(st.binary(min_size=1, max_size=8), label="tail")
        try:
            decode(grown)
        except wire.WireError:
            pass
        else:
            raise AssertionError("a message with bytes after its payload decoded")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights_messages(), array_messages(), st.data())
def test_a_damage_within_4_bytes_of_the_checksum_or_what_it_covers_is_a_checksum_mismatch(
        weights: tuple[bytes, wire.WireHeader, np.ndarray], array: tuple[bytes, dict[str, Any], np.ndarray],
        data: st.DataObject) -> None:
    for message, decode in ((weights[0], wire.decode), (array[0], wire_arrays.decode_array)):
        at = data.draw(st.integers(4, len(message) - 1), label="at")
        width = min(4, (8 if at < 8 else len(message)) - at)  # within the checksum field, or within what it covers
        mask = bytearray(data.draw(st.binary(min_size=width, max_size=width), label="mask"))
        mask[0] |= 0 if any(mask) else 1  # (some bit changes)
        burst = bytes(byte ^ bit for byte, bit in zip(message[at:at + width], mask, strict=True))
        broken = message[:at] + burst + message[at + width:]
        try:
            decode(broken)
        except wire.ChecksumMismatch:
            pass
        else:
            raise AssertionError(f"bytes {at}-{at + width - 1} changed, and no checksum mismatch")


@PROPERTY_SETTINGS
@given(array_messages(), st.lists(DAMAGES, max_size=1))
def test_a_version_2_array_does_not_pass_for_another_version_1_array(
        drawn: tuple[bytes, dict[str, Any], np.ndarray], damages: list) -> None:
    """The version byte made "1" (version 1 arrays are read without a checksum) and one more damage: a
    WireError or the very same array."""
    message, meta, array = drawn
    data = damaged(message[:3] + b"1" + message[4:], damages)
    assert_same_array(decode_array_or_wire_error(data), meta, array)
    # removing the 4 checksum bytes makes a version 1 message: of the same array
    assert_same_array(wire_arrays.decode_array(wire.OLD_ARRAY_MAGIC + message[8:]), meta, array)


@PROPERTY_SETTINGS
@given(weights_messages(), st.lists(DAMAGES, max_size=3))
def test_a_version_1_weights_message_is_always_refused(drawn: tuple[bytes, wire.WireHeader, np.ndarray],
                                                       damages: list) -> None:
    message, _, _ = drawn
    for old in (wire.OLD_WEIGHTS_MAGIC + message[8:], wire.OLD_WEIGHTS_MAGIC + damaged(message[4:], damages)):
        try:
            wire.decode(old)
        except wire.OutdatedFormat as error:
            assert "out of date" in str(error)
        else:
            raise AssertionError("a version 1 weights message decoded")


@PROPERTY_SETTINGS
@given(st.dictionaries(st.sampled_from(["spec", "round", "fingerprint", "num_examples", "metrics", "meta", "x",
                                        "dtype", "shape"]), JSON_VALUES, max_size=7)
       | JSON_VALUES, st.binary(max_size=32))
def test_any_json_header_raises_a_wire_error_or_decodes(header: Any, payload: bytes) -> None:
    """Any JSON value at all in the header, with any payload and a right checksum: a WireError or a message."""
    text = json.dumps(header).encode()
    for message, decode in ((sealed(wire.WEIGHTS_MAGIC, text, payload), wire.decode),
                            (sealed(wire.ARRAY_MAGIC, text, payload), wire_arrays.decode_array),
                            (old_array(text, payload), wire_arrays.decode_array)):
        try:
            decode(message)
        except wire.WireError:
            pass


def test_a_header_nested_thousands_deep_is_a_malformed_header() -> None:
    """``json.loads`` gives up with RecursionError, which escaped the codec (a 500 at the relay)."""
    for text in (b"[" * 5000, b'{"a":' * 5000):
        for message, decode in ((sealed(wire.WEIGHTS_MAGIC, text, b""), wire.decode),
                                (sealed(wire.ARRAY_MAGIC, text, b""), wire_arrays.decode_array),
                                (old_array(text, b""), wire_arrays.decode_array)):
            try:
                decode(message)
            except wire.MalformedHeader as error:
                assert "nests too deeply" in str(error)
            else:
                raise AssertionError("decoded")
