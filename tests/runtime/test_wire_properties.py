"""Hypothesis properties of the wire codec (``runtime.wire``): what a damaged message can and cannot do.

Messages are drawn (specs, finite float32 weights, headers; int32 and float32 arrays) and then damaged: bytes
flipped, inserted or deleted anywhere, any number of times, or the message cut short. The properties:

* the codec answers any damaged message with its own ``WireError`` or a decoded message, never with another
  exception (a relay would have turned that into a 500); the same for any JSON at all in the header;
* a message cut short, or grown at the end, always raises;
* one damaged byte, inserted or deleted anywhere before the payload (preamble, header, padding) never decodes
  to other weights: the relay's decode (spec, round and fingerprint expected) raises or returns the very same
  vector (a header field the relay does not rely on, such as a metric, may come out changed);
* a damaged payload byte changes only the value it belongs to. The format has no checksum: a payload byte
  flipped in transit decodes to that one value changed, unless it makes the value non-finite (NaN or
  infinity: refused). The relay's checks behind the codec (update norm, outliers, host replays) judge values.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import wire
from runtime.weights import WeightSpec

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

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
def array_messages(draw: st.DrawFn) -> tuple[bytes, np.ndarray]:
    shape = draw(st.lists(st.integers(1, 5), min_size=0, max_size=3))
    count = int(np.prod(shape))
    array: np.ndarray
    if draw(st.booleans()):
        array = np.array(draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=count, max_size=count)),
                         dtype=np.int32).reshape(shape)
    else:
        array = np.array(draw(st.lists(FLOATS, min_size=count, max_size=count)), dtype=np.float32).reshape(shape)
    return wire.encode_array(array, meta=draw(st.dictionaries(NAMES, JSON_SCALARS, max_size=2))), array


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


def payload_start(message: bytes) -> int:
    (header_length,) = struct.unpack("<I", message[4:8])
    end = wire.PREAMBLE_BYTES + header_length
    return end + (-end % 4)


def decode_or_wire_error(data: bytes, **expected: Any) -> tuple[wire.WireHeader, np.ndarray] | None:
    """The decoded message, or None for a WireError; any other exception fails the test."""
    try:
        return wire.decode(data, **expected)
    except wire.WireError:
        return None


def expectations(header: wire.WireHeader) -> dict[str, Any]:
    """What the relay's decode of a result expects (``server.relay.checks.decode_result``)."""
    return {"expect_spec": header.spec, "expect_round": header.round, "expect_fingerprint": header.fingerprint}


@PROPERTY_SETTINGS
@given(weights_messages(), st.lists(DAMAGES, min_size=1, max_size=6), st.booleans())
def test_a_damaged_weights_message_raises_a_wire_error_or_decodes(drawn: tuple[bytes, wire.WireHeader, np.ndarray],
                                                                  damages: list, expect: bool) -> None:
    message, header, _ = drawn
    data = damaged(message, damages)
    decoded = decode_or_wire_error(data, **(expectations(header) if expect else {}))
    if decoded is not None:
        assert decoded[1].dtype == np.float32 and np.isfinite(decoded[1]).all()
        assert decoded[1].shape == (decoded[0].spec.size,)


@PROPERTY_SETTINGS
@given(array_messages(), st.lists(DAMAGES, min_size=1, max_size=6))
def test_a_damaged_array_message_raises_a_wire_error_or_decodes(drawn: tuple[bytes, np.ndarray],
                                                                damages: list) -> None:
    message, _ = drawn
    try:
        _, array = wire.decode_array(damaged(message, damages))
    except wire.WireError:
        return
    assert array.dtype in (np.int32, np.float32)


@PROPERTY_SETTINGS
@given(weights_messages(), array_messages(), st.data())
def test_a_message_cut_short_or_grown_at_the_end_raises(weights: tuple[bytes, wire.WireHeader, np.ndarray],
                                                        array: tuple[bytes, np.ndarray], data: st.DataObject) -> None:
    for message, decode in ((weights[0], wire.decode), (array[0], wire.decode_array)):
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
@given(weights_messages(), DAMAGES)
def test_one_damaged_byte_before_the_payload_never_decodes_to_other_weights(
        drawn: tuple[bytes, wire.WireHeader, np.ndarray], damage: tuple[str, float, Any]) -> None:
    message, header, vector = drawn
    kind, fraction, value = damage
    # The damage lands in the preamble, the header or the padding: [0, payload start).
    data = damaged(message, [(kind, fraction, value)], within=payload_start(message))
    decoded = decode_or_wire_error(data, **expectations(header))
    if decoded is not None:
        got_header, got = decoded
        assert got.tobytes() == vector.tobytes()
        assert (got_header.spec, got_header.round, got_header.fingerprint) == (header.spec, header.round,
                                                                               header.fingerprint)


@PROPERTY_SETTINGS
@given(weights_messages(), st.data())
def test_a_damaged_payload_byte_changes_only_its_own_value(drawn: tuple[bytes, wire.WireHeader, np.ndarray],
                                                           data: st.DataObject) -> None:
    message, header, vector = drawn
    start = payload_start(message)
    if start == len(message):
        return  # (an empty payload)
    at = data.draw(st.integers(start, len(message) - 1), label="at")
    damaged_message = bytearray(message)
    damaged_message[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    try:
        got_header, got = wire.decode(bytes(damaged_message), **expectations(header))
    except wire.NonFiniteWeights:
        return  # the flip made the value NaN or infinite: refused
    changed = np.flatnonzero(got.view(np.uint32) != vector.view(np.uint32))
    assert changed.tolist() == [(at - start) // 4]
    assert got_header == header


@PROPERTY_SETTINGS
@given(st.dictionaries(st.sampled_from(["spec", "round", "fingerprint", "num_examples", "metrics", "meta", "x"]),
                       JSON_VALUES, max_size=7)
       | JSON_VALUES, st.binary(max_size=32))
def test_any_json_header_raises_a_wire_error_or_decodes(header: Any, payload: bytes) -> None:
    """Any JSON value at all in the header, with any payload: a WireError or a message, nothing else."""
    text = json.dumps(header).encode()
    padding = b"\0" * (-(wire.PREAMBLE_BYTES + len(text)) % 4)
    for magic, decode in ((wire.WEIGHTS_MAGIC, wire.decode), (wire.ARRAY_MAGIC, wire.decode_array)):
        try:
            decode(magic + struct.pack("<I", len(text)) + text + padding + payload)
        except wire.WireError:
            pass


def test_a_header_nested_thousands_deep_is_a_malformed_header() -> None:
    """``json.loads`` gives up with RecursionError, which escaped the codec (a 500 at the relay)."""
    for text in (b"[" * 5000, b'{"a":' * 5000):
        message = wire.WEIGHTS_MAGIC + struct.pack("<I", len(text)) + text
        for decode in (wire.decode, wire.decode_array):
            try:
                decode(message if decode is wire.decode else wire.ARRAY_MAGIC + message[4:])
            except wire.MalformedHeader as error:
                assert "nests too deeply" in str(error)
            else:
                raise AssertionError("decoded")
