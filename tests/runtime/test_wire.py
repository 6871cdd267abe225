from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime import wire
from runtime.weights import WeightSpec
from runtime.wire import (
    BadMagic,
    ChecksumMismatch,
    DtypeMismatch,
    FingerprintMismatch,
    HeaderLengthOutOfBounds,
    LengthMismatch,
    MalformedHeader,
    NonFiniteWeights,
    OutdatedFormat,
    ShapeMismatch,
    StaleRound,
    TruncatedMessage,
    WireError,
    WireHeader,
    decode,
    encode,
)
from runtime.wire_arrays import decode_array, encode_array

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


def frame(header: dict[str, Any] | bytes, payload: bytes, magic: bytes = b"PTW2") -> bytes:
    """Build a message by hand, independently of the codec, to feed it bad input (a right checksum, so that the
    checks behind it are reached). A version 1 magic (b"PTW1", b"PTA1") builds the old layout, without one."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    if magic.endswith(b"1"):
        padding = b"\0" * ((4 - (8 + len(header_bytes)) % 4) % 4)
        return magic + struct.pack("<I", len(header_bytes)) + header_bytes + padding + payload
    padding = b"\0" * ((4 - (12 + len(header_bytes)) % 4) % 4)
    covered = struct.pack("<I", len(header_bytes)) + header_bytes + padding + payload
    return magic + struct.pack("<I", zlib.crc32(covered)) + covered


def sealed(data: bytes | bytearray) -> bytes:
    """A version 2 message altered by hand, its checksum recomputed independently of the codec."""
    return bytes(data[:4]) + struct.pack("<I", zlib.crc32(bytes(data[8:]))) + bytes(data[8:])


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
    assert data[:4] == b"PTW2"
    (checksum, header_length) = struct.unpack("<II", data[4:12])
    assert checksum == zlib.crc32(data[8:])  # over the header length, header, padding and payload
    header = json.loads(data[12 : 12 + header_length])
    assert header["spec"] == {"names": ["w", "b"], "shapes": [[2, 2], [2]], "dtype": "float32"}
    assert (header["round"], header["fingerprint"], header["num_examples"]) == (3, "abc123", 128)
    assert header["metrics"] == {"loss": 2.5} and header["meta"] == {"peer": "p1"}
    payload_start = len(data) - 4 * 6
    assert payload_start % 4 == 0
    assert 0 <= payload_start - (12 + header_length) < 4
    assert set(data[12 + header_length : payload_start]) <= {0}
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
    with pytest.raises(ChecksumMismatch, match=f"the {len(data) - 4}-byte message .* damaged or cut short") as caught:
        decode(data[:-4])  # cut short on its way: the checksum no longer matches
    assert (caught.value.code, caught.value.http_status) == ("checksum", 400)
    with pytest.raises(ChecksumMismatch):
        decode(data[:-1])
    # a checksum that matches a short payload (a sender's bug, not the way): the length check still holds
    with pytest.raises(LengthMismatch, match="payload is 20 bytes, expected 24") as length:
        decode(sealed(data[:-4]))
    assert length.value.code == "length_mismatch"


def test_extra_payload_bytes() -> None:
    data = encode(VECTOR, make_header()) + b"\0\0\0\0"
    with pytest.raises(ChecksumMismatch):
        decode(data)
    with pytest.raises(LengthMismatch, match="payload is 28 bytes"):
        decode(sealed(data))


@pytest.mark.parametrize("at", [4, 7, 8, 11, 12, 40, -24, -1])
def test_one_flipped_bit_anywhere_after_the_magic_is_a_checksum_mismatch(at: int) -> None:
    data = bytearray(encode(VECTOR, make_header()))
    data[at] ^= 0x10
    with pytest.raises(ChecksumMismatch):
        decode(bytes(data))


def test_checksum_is_checked_before_the_header_is_read() -> None:
    # a damaged round that would have read as a stale result is a damaged message
    data = encode(VECTOR, make_header(round=3))
    damaged = data.replace(b'"round":3', b'"round":2')
    assert damaged != data
    with pytest.raises(ChecksumMismatch):
        decode(damaged, expect_round=3)
    with pytest.raises(StaleRound):
        decode(sealed(damaged), expect_round=3)


def test_truncated_preamble() -> None:
    with pytest.raises(TruncatedMessage, match="shorter than the 12-byte preamble"):
        decode(b"PTW2\x10")
    with pytest.raises(TruncatedMessage, match="shorter than the 12-byte preamble"):
        decode(b"PT")


def test_wrong_magic() -> None:
    data = encode(VECTOR, make_header())
    with pytest.raises(BadMagic, match="expected b'PTW2'") as caught:
        decode(b"XXXX" + data[4:])
    assert caught.value.code == "bad_magic"


def test_version_1_weights_message_is_refused_as_outdated() -> None:
    old = frame(header_json(), GOOD_PAYLOAD, magic=b"PTW1")  # what a runtime before the checksum sent
    with pytest.raises(OutdatedFormat, match="version 1 weights message .*b'PTW1'.* only version 2 .*b'PTW2'.*"
                       "the sending peer's runtime is out of date. Reload the page") as caught:
        decode(old, expect_spec=SPEC, expect_round=3, expect_fingerprint="abc123")
    assert (caught.value.code, caught.value.http_status) == ("outdated_format", 400)
    assert isinstance(caught.value, BadMagic)
    with pytest.raises(OutdatedFormat):
        decode(b"PTW1")  # refused on the magic alone, however short


def test_reseal_recomputes_the_checksum() -> None:
    data = bytearray(encode(VECTOR, make_header()))
    data[-1] ^= 0x01  # the last byte of the last value: its lowest mantissa bit
    assert wire.reseal(bytes(data)) == sealed(data)
    _, vector = decode(wire.reseal(bytes(data)))
    assert vector[-1] != VECTOR[-1] and (vector[:-1] == VECTOR[:-1]).all()
    assert wire.reseal(b"PTW2\0") == b"PTW2\0"


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
    data[8:12] = struct.pack("<I", len(data))  # header would run past the end
    with pytest.raises(ChecksumMismatch):
        decode(bytes(data))
    with pytest.raises(HeaderLengthOutOfBounds, match="runs past the end") as caught:
        decode(sealed(data))
    assert caught.value.code == "header_length"


def test_header_length_beyond_limit() -> None:
    data = sealed(b"PTW2\0\0\0\0" + struct.pack("<I", wire.MAX_HEADER_BYTES + 1) + b"{}")
    with pytest.raises(HeaderLengthOutOfBounds, match="exceeds the limit"):
        decode(data)


def test_nonzero_padding() -> None:
    data = bytearray(encode(VECTOR, make_header()))
    (header_length,) = struct.unpack("<I", data[8:12])
    if (12 + header_length) % 4 == 0:  # make sure there is padding to corrupt
        data = bytearray(encode(VECTOR, make_header(fingerprint="abc1234")))
        (header_length,) = struct.unpack("<I", data[8:12])
    assert (12 + header_length) % 4 != 0
    data[12 + header_length] = 1
    with pytest.raises(ChecksumMismatch):
        decode(bytes(data))
    with pytest.raises(MalformedHeader, match="padding"):
        decode(sealed(data))


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
    assert len(set(codes)) == len(codes) == 14
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
    assert data[:4] == b"PTA2"
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
        decode_array(frame(header, payload, magic=b"PTA2"))
    with pytest.raises(error, match=message):
        decode_array(frame(header, payload, magic=b"PTA1"))  # the same checks for a version 1 chunk


def test_decode_array_expect_dtype_and_magic() -> None:
    data = encode_array(np.zeros(2, dtype=np.float32))
    with pytest.raises(DtypeMismatch, match="expected 'int32'"):
        decode_array(data, expect_dtype="int32")
    with pytest.raises(BadMagic):
        decode(data)  # an array message is not a weights message


def test_array_checksum_and_magic() -> None:
    data = bytearray(encode_array(np.arange(6, dtype=np.int32)))
    data[-2] ^= 0x01
    with pytest.raises(ChecksumMismatch):
        decode_array(bytes(data))
    with pytest.raises(BadMagic, match="expected b'PTA2'"):
        decode_array(encode(VECTOR, make_header()))  # a weights message is not an array message
    with pytest.raises(BadMagic):
        decode_array(frame(header_json(), GOOD_PAYLOAD, magic=b"PTW1"))


def old_chunk(array: np.ndarray, meta: dict[str, Any]) -> bytes:
    """A chunk file as packages built before the checksum hold it: PTA1, the header at offset 8, no checksum
    (the old encoder's bytes: compact JSON, zero padding to 4)."""
    header = json.dumps({"dtype": "int32", "shape": list(array.shape), "meta": meta}, separators=(",", ":")).encode()
    padding = b"\0" * (-(8 + len(header)) % 4)
    return b"PTA1" + struct.pack("<I", len(header)) + header + padding + array.astype("<i4").tobytes()


@pytest.mark.parametrize("length", [0, 1, 5, 64])
def test_version_1_chunks_still_load(length: int, tmp_path: Path) -> None:
    tokens = (np.arange(length * 3, dtype=np.int32) * 7919 - 1000).reshape(length, 3)
    path = tmp_path / "00003.ptw"
    path.write_bytes(old_chunk(tokens, {"unit": 3}))
    meta, decoded = decode_array(path.read_bytes(), expect_dtype="int32")  # as server.session.package loads it
    assert meta == {"unit": 3} and decoded.dtype == np.int32 and decoded.shape == (length, 3)
    np.testing.assert_array_equal(decoded, tokens)
    # the version 2 message of the same chunk is the old one with a checksum inserted at offset 4
    current = encode_array(tokens, meta={"unit": 3})
    assert current[:4] == b"PTA2" and current[8:] == old_chunk(tokens, {"unit": 3})[4:]


@pytest.mark.parametrize("length", [0, 1, 2, 3, 5, 64, 1000])
def test_a_version_2_array_with_its_version_byte_changed_is_not_a_version_1_array(length: int) -> None:
    """Version 1 arrays are read without a checksum; a damaged version 2 one must not pass for one."""
    for meta in ({}, {"unit": 12345}, {"x": "y" * length}):
        data = encode_array(np.arange(length, dtype=np.int32) - 3, meta=meta)
        for version in range(256):  # every value of the version byte (b"1" among them)
            if version != ord("2"):
                with pytest.raises(WireError):
                    decode_array(data[:3] + bytes([version]) + data[4:])
        # the version byte and the 4 checksum bytes gone too: a version 1 message, of the very same array
        meta_back, array = decode_array(b"PTA1" + data[8:])
        assert meta_back == meta
        np.testing.assert_array_equal(array, np.arange(length, dtype=np.int32) - 3)


def test_a_package_built_before_the_checksum_still_loads_and_serves_its_chunks(tmp_path: Path) -> None:
    """``server.session.package`` keeps chunk files as array messages: a package of version 1 ones loads."""
    from server.session.package import Package, build_package

    task = Path(__file__).resolve().parents[2] / "examples" / "majority_task.py"
    built = build_package(str(task), {"chunks": 3, "examples": 96, "epochs": 1}, tmp_path / "package", seed=0,
                          check=False, log=lambda _: None)
    assert built.data.units is not None
    for index, unit in enumerate(built.data.units):  # rewrite the chunks as an older peertrain wrote them
        (tmp_path / "package" / "chunks" / f"{index:05d}.ptw").write_bytes(old_chunk(unit, {"unit": index}))
    loaded = Package.load(tmp_path / "package")
    assert loaded.data.units is not None and len(loaded.data.units) == 3
    for index, unit in enumerate(built.data.units):
        np.testing.assert_array_equal(loaded.data.units[index], unit)
        served = loaded.chunk_bytes(index)  # what GET /api/unit/{i} sends a peer, as stored
        assert served[:4] == b"PTA1"
        meta, decoded = decode_array(served, expect_dtype="int32")  # as runtime.peer reads it
        assert meta == {"unit": index}
        np.testing.assert_array_equal(decoded, unit)
