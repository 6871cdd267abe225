from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from runtime import wire
from runtime.weights import WeightSpec
from runtime.wire import (
    BadMagic,
    DtypeMismatch,
    FingerprintMismatch,
    HeaderLengthOutOfBounds,
    LengthMismatch,
    MalformedHeader,
    NonFiniteWeights,
    ShapeMismatch,
    StaleRound,
    TruncatedMessage,
    WireError,
    WireHeader,
    decode,
    decode_array,
    encode,
    encode_array,
)

SPEC = WeightSpec((("w", (2, 2)), ("b", (2,))))  # 6 values


def make_header(**changes: Any) -> WireHeader:
    fields: dict[str, Any] = dict(
        spec=SPEC, round=3, fingerprint="abc123", num_examples=128, metrics={"loss": 2.5}, meta={"peer": "p1"}
    )
    fields.update(changes)
    return WireHeader(**fields)


def header_json(**changes: Any) -> dict[str, Any]:
    header = make_header().to_json()
    header.update(changes)
    return header


def frame(header: dict[str, Any] | bytes, payload: bytes, magic: bytes = b"PTW1") -> bytes:
    """Build a message by hand, independently of the codec, to feed it bad input."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    padding = b"\0" * ((4 - (8 + len(header_bytes)) % 4) % 4)
    return magic + struct.pack("<I", len(header_bytes)) + header_bytes + padding + payload


VECTOR = np.array([1.0, -2.0, 0.5, 3.25, 0.0, 100.0], dtype=np.float32)
GOOD_PAYLOAD = VECTOR.astype("<f4").tobytes()


def test_round_trip() -> None:
    header, vector = decode(
        encode(VECTOR, make_header()), expect_spec=SPEC, expect_round=3, expect_fingerprint="abc123"
    )
    assert header == make_header()
    assert vector.dtype == np.float32
    np.testing.assert_array_equal(vector, VECTOR)
    vector[0] = 9.0  # a writable copy, not a view into the message
    assert vector[0] == 9.0


def test_byte_layout() -> None:
    data = encode(VECTOR, make_header())
    assert data[:4] == b"PTW1"
    (header_length,) = struct.unpack("<I", data[4:8])
    header = json.loads(data[8 : 8 + header_length])
    assert header["spec"] == {"names": ["w", "b"], "shapes": [[2, 2], [2]], "dtype": "float32"}
    assert (header["round"], header["fingerprint"], header["num_examples"]) == (3, "abc123", 128)
    assert header["metrics"] == {"loss": 2.5} and header["meta"] == {"peer": "p1"}
    payload_start = len(data) - 4 * 6
    assert payload_start % 4 == 0
    assert 0 <= payload_start - (8 + header_length) < 4
    assert set(data[8 + header_length : payload_start]) <= {0}
    assert data[payload_start : payload_start + 4] == b"\x00\x00\x80\x3f"  # 1.0 as little-endian float32


def test_frame_helper_matches_the_codec() -> None:
    # the hand-built frame (JSON with spaces) decodes like an encoded message
    header, vector = decode(frame(header_json(), GOOD_PAYLOAD))
    assert header == make_header()
    np.testing.assert_array_equal(vector, VECTOR)


def test_encode_refuses_non_finite_and_wrong_length() -> None:
    with pytest.raises(NonFiniteWeights, match="entry 'b'"):
        encode(np.array([0, 0, 0, 0, np.nan, 0], dtype=np.float32), make_header())
    with pytest.raises(LengthMismatch):
        encode(np.zeros(5, dtype=np.float32), make_header())


def test_encode_refuses_nan_metric() -> None:
    with pytest.raises(MalformedHeader, match="strict JSON"):
        encode(VECTOR, make_header(metrics={"loss": float("nan")}))


@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
def test_non_finite_payload(bad_value: float) -> None:
    vector = VECTOR.copy()
    vector[1] = bad_value
    data = encode(vector, make_header(), check_finite=False)
    with pytest.raises(NonFiniteWeights, match="1 of 6 weights are not finite; .* in entry 'w'") as caught:
        decode(data)
    assert caught.value.code == "non_finite"


def test_truncated_payload() -> None:
    data = encode(VECTOR, make_header())
    with pytest.raises(LengthMismatch, match="payload is 20 bytes, expected 24") as caught:
        decode(data[:-4])
    assert caught.value.code == "length_mismatch"
    with pytest.raises(LengthMismatch):
        decode(data[:-1])


def test_extra_payload_bytes() -> None:
    with pytest.raises(LengthMismatch, match="payload is 28 bytes"):
        decode(encode(VECTOR, make_header()) + b"\0\0\0\0")


def test_truncated_preamble() -> None:
    with pytest.raises(TruncatedMessage, match="shorter than the 8-byte preamble"):
        decode(b"PTW1\x10")


def test_wrong_magic() -> None:
    data = encode(VECTOR, make_header())
    with pytest.raises(BadMagic, match="expected b'PTW1'") as caught:
        decode(b"XXXX" + data[4:])
    assert caught.value.code == "bad_magic"


@pytest.mark.parametrize("dtype", ["float64", "<f4", ">f4", "float32be", "int32", "FLOAT32"])
def test_wrong_dtype_string(dtype: str) -> None:
    header = header_json()
    header["spec"]["dtype"] = dtype
    with pytest.raises(DtypeMismatch, match=f"weights dtype is '{dtype}'"):
        decode(frame(header, GOOD_PAYLOAD))


def test_bad_json() -> None:
    with pytest.raises(MalformedHeader, match="not valid JSON"):
        decode(frame(b'{"spec": ', GOOD_PAYLOAD))


def test_header_not_utf8() -> None:
    with pytest.raises(MalformedHeader, match="UTF-8"):
        decode(frame(b'{"a": "\xff\xfe"}', GOOD_PAYLOAD))


def test_header_with_nan_constant_is_not_json() -> None:
    text = json.dumps(header_json(metrics={"loss": float("nan")}))  # Python writes NaN, strict JSON has none
    with pytest.raises(MalformedHeader, match="NaN"):
        decode(frame(text.encode(), GOOD_PAYLOAD))


def test_header_must_be_an_object() -> None:
    with pytest.raises(MalformedHeader, match="JSON object"):
        decode(frame(b"[1, 2, 3]", GOOD_PAYLOAD))


def test_header_length_beyond_buffer() -> None:
    data = bytearray(encode(VECTOR, make_header()))
    data[4:8] = struct.pack("<I", len(data))  # header would run past the end
    with pytest.raises(HeaderLengthOutOfBounds, match="runs past the end") as caught:
        decode(bytes(data))
    assert caught.value.code == "header_length"


def test_header_length_beyond_limit() -> None:
    data = b"PTW1" + struct.pack("<I", wire.MAX_HEADER_BYTES + 1) + b"{}"
    with pytest.raises(HeaderLengthOutOfBounds, match="exceeds the limit"):
        decode(data)


def test_nonzero_padding() -> None:
    data = bytearray(encode(VECTOR, make_header()))
    (header_length,) = struct.unpack("<I", data[4:8])
    if (8 + header_length) % 4 == 0:  # make sure there is padding to corrupt
        data = bytearray(encode(VECTOR, make_header(fingerprint="abc1234")))
        (header_length,) = struct.unpack("<I", data[4:8])
    assert (8 + header_length) % 4 != 0
    data[8 + header_length] = 1
    with pytest.raises(MalformedHeader, match="padding"):
        decode(bytes(data))


@pytest.mark.parametrize("field", ["spec", "round", "fingerprint", "num_examples", "metrics"])
def test_missing_required_field(field: str) -> None:
    header = header_json()
    del header[field]
    with pytest.raises(MalformedHeader, match=f"missing required field '{field}'") as caught:
        decode(frame(header, GOOD_PAYLOAD))
    assert caught.value.code == "malformed_header"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"round": "3"}, "'round' must be"),
        ({"round": True}, "'round' must be"),
        ({"round": -1}, "'round' must be a non-negative"),
        ({"num_examples": 1.5}, "'num_examples' must be"),
        ({"fingerprint": 7}, "'fingerprint' must be a string"),
        ({"metrics": {"loss": "low"}}, "metric 'loss' must be a number"),
        ({"metrics": [1.0]}, "'metrics' must be"),
        ({"meta": [1]}, "'meta' must be an object"),
        ({"spec": {"names": ["w", "w"], "shapes": [[2], [2]], "dtype": "float32"}}, "'spec' is invalid.*twice"),
        ({"spec": {"names": ["w"], "shapes": [[2]]}}, "'spec' is missing 'dtype'"),
    ],
)
def test_wrong_field_types(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(MalformedHeader, match=message):
        decode(frame(header_json(**changes), GOOD_PAYLOAD))


def test_meta_is_optional() -> None:
    header = header_json()
    del header["meta"]
    decoded, _ = decode(frame(header, GOOD_PAYLOAD))
    assert decoded.meta == {}


def test_shape_mismatch_names_the_entry() -> None:
    other = WeightSpec((("w", (2, 2)), ("b", (3,))))
    with pytest.raises(ShapeMismatch, match="entry 1: expected 'b' \\[3\\], got 'b' \\[2\\]") as caught:
        decode(encode(VECTOR, make_header()), expect_spec=other)
    assert caught.value.code == "shape_mismatch"


def test_stale_round() -> None:
    with pytest.raises(StaleRound, match="round 3, the current round is 4") as caught:
        decode(encode(VECTOR, make_header()), expect_round=4)
    assert caught.value.code == "stale_round"


def test_fingerprint_mismatch() -> None:
    with pytest.raises(FingerprintMismatch, match="'abc123'.*'zzz'") as caught:
        decode(encode(VECTOR, make_header()), expect_fingerprint="zzz")
    assert caught.value.code == "fingerprint_mismatch"


def test_error_codes_are_distinct_and_4xx() -> None:
    classes = [cls for cls in vars(wire).values() if isinstance(cls, type) and issubclass(cls, WireError)]
    classes.remove(WireError)
    codes = [cls.code for cls in classes]
    assert len(set(codes)) == len(codes) == 10
    assert all(code.replace("_", "").isalpha() and code.islower() for code in codes)
    assert all(400 <= cls.http_status < 500 for cls in classes)
    assert all(issubclass(cls, ValueError) for cls in classes)


def test_empty_spec_round_trip() -> None:
    header, vector = decode(encode(np.zeros(0, dtype=np.float32), make_header(spec=WeightSpec(()))))
    assert header.spec.size == 0 and vector.shape == (0,)


# ---------------------------------------------------------------- arrays


def test_int32_array_round_trip() -> None:
    tokens = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    meta, decoded = decode_array(encode_array(tokens, meta={"chunk": 7}), expect_dtype="int32")
    assert meta == {"chunk": 7}
    assert decoded.dtype == np.int32 and decoded.shape == (3, 4)
    np.testing.assert_array_equal(decoded, tokens)


def test_float32_array_round_trip_from_big_endian() -> None:
    values = np.array([1.5, -2.0], dtype=">f4")
    data = encode_array(values)
    assert data[:4] == b"PTA1"
    assert data[-8:-4] == b"\x00\x00\xc0\x3f"  # 1.5 little-endian
    _, decoded = decode_array(data)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, [1.5, -2.0])


def test_encode_array_refuses_other_dtypes() -> None:
    with pytest.raises(DtypeMismatch, match="int64"):
        encode_array(np.zeros(3, dtype=np.int64))


@pytest.mark.parametrize(
    "header, payload, error, message",
    [
        ({"dtype": "int64", "shape": [2]}, b"\0" * 16, DtypeMismatch, "only 'int32' and 'float32'"),
        ({"dtype": "int32", "shape": [3]}, b"\0" * 8, LengthMismatch, "expected 12"),
        ({"dtype": "int32", "shape": [2, -1]}, b"", MalformedHeader, "'shape'"),
        ({"dtype": "int32"}, b"", MalformedHeader, "missing required field 'shape'"),
        ({"dtype": "float32", "shape": [1]}, struct.pack("<f", float("inf")), NonFiniteWeights, "not finite"),
    ],
)
def test_decode_array_failures(header: dict[str, Any], payload: bytes, error: type[WireError], message: str) -> None:
    with pytest.raises(error, match=message):
        decode_array(frame(header, payload, magic=b"PTA1"))


def test_decode_array_expect_dtype_and_magic() -> None:
    data = encode_array(np.zeros(2, dtype=np.float32))
    with pytest.raises(DtypeMismatch, match="expected 'int32'"):
        decode_array(data, expect_dtype="int32")
    with pytest.raises(BadMagic):
        decode(data)  # an array message is not a weights message
