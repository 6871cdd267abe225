"""Weights downloads as chains of compressed steps (``runtime.deltas``): a step moves the weights by exactly what
its payload decodes to, a chain rebuilds the named weights bit for bit, and every way a chain can be wrong is
refused with its own code before a peer trains on other weights."""

from __future__ import annotations

import numpy as np
import pytest

from runtime import wire
from runtime.codec import Codec, ErrorFeedback
from runtime.deltas import (
    MAX_LINKS,
    ChainMismatch,
    Step,
    StepLog,
    apply_chain,
    encode_chain,
    quantized_step,
    weights_sha256,
)
from runtime.weights import WeightSpec

SPEC = WeightSpec((("w", (3000,)), ("b", (10,))))
FINGERPRINT = "f" * 16


def steps(codec: Codec, rounds: int, seed: int = 0) -> tuple[list[np.ndarray], list[Step], ErrorFeedback]:
    """Weights of rounds 0..rounds and the steps between them, as a session makes them from random merges."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(SPEC.size).astype(np.float32)]
    feedback, log = ErrorFeedback(SPEC.size), []
    for r in range(rounds):
        merged = weights[-1] + 0.01 * rng.standard_normal(SPEC.size).astype(np.float32)
        applied, payload, _ = quantized_step(codec, weights[-1], merged, 1000 + r, feedback)
        log.append(Step(r, weights_sha256(weights[-1]), weights_sha256(applied), payload))
        weights.append(applied)
    return weights, log, feedback


def test_a_step_moves_the_weights_by_exactly_what_its_payload_decodes_to() -> None:
    codec = Codec("int8")
    before = np.array([1.0, -2.0, 0.5, 0.0] * 80, dtype=np.float32)
    merged = before + np.float32(0.125) * np.sign(before)  # a step of +-0.125 and zeros
    applied, payload, error = quantized_step(codec, before, merged, 7, ErrorFeedback(before.size))
    assert np.array_equal(applied, before + codec.decode(payload, before.size))
    # Each block's scale is 0.125 / 127, so +-0.125 is +-127 exactly and zeros stay zero: no error at all.
    assert error == 0.0 and np.array_equal(applied, merged)
    assert len(payload) == codec.payload_bytes(before.size) == 4 * 2 + 320


def test_topk_steps_carry_what_they_dropped_into_the_next_step() -> None:
    codec = Codec("topk", 0.05)
    weights, log, feedback = steps(codec, 3)
    total_step = (weights[-1].astype(np.float64) - weights[0])
    # after 3 steps, what was sent plus the residual is the sum of the merged steps (up to float32 rounding)
    rng = np.random.default_rng(0)
    rng.standard_normal(SPEC.size)
    merged_sum = sum(0.01 * rng.standard_normal(SPEC.size).astype(np.float32).astype(np.float64) for _ in range(3))
    assert np.allclose(total_step + feedback.residual, merged_sum, atol=1e-5)
    assert np.abs(feedback.residual).sum() > 0
    assert all(np.count_nonzero(codec.decode(s.payload, SPEC.size)) <= codec.kept(SPEC.size).sum() for s in log)


@pytest.mark.parametrize("codec", [Codec("int8"), Codec("topk", 0.1)])
def test_a_chain_rebuilds_the_named_weights_bit_for_bit(codec: Codec) -> None:
    weights, log, _ = steps(codec, 4)
    message = encode_chain(log[1:], spec=SPEC, fingerprint=FINGERPRINT, codec=codec, round_index=4)
    round_index, rebuilt = apply_chain(message, weights[1], spec=SPEC, fingerprint=FINGERPRINT)
    assert round_index == 4 and rebuilt.dtype == np.float32
    assert np.array_equal(rebuilt, weights[4]) and weights_sha256(rebuilt) == log[-1].digest
    full = wire.encode(weights[4], wire.WireHeader(spec=SPEC, round=4, fingerprint=FINGERPRINT, num_examples=0))
    assert len(message) < len(full)


def test_the_log_finds_chains_and_keeps_no_more_than_one_full_vector() -> None:
    codec = Codec("int8")
    weights, log, _ = steps(codec, 6)
    book = StepLog(budget=4 * SPEC.size)
    for step in log:
        book.add(step)
    kept = len(book.steps)
    assert kept == 3  # 3 int8 steps (4 bytes of scale per 256 entries) fit in one float32 vector's bytes
    digests = [weights_sha256(w) for w in weights]
    assert book.chain(digests[4], digests[6]) == log[4:6]
    assert book.chain(digests[6], digests[6]) == []
    assert book.chain(digests[0], digests[6]) is None  # trimmed away
    assert book.chain("0" * 64, digests[6]) is None
    # A rollback: round 6 starts again from round 4's weights, then steps on.
    rolled = Step(6, digests[4], "a" * 64, log[5].payload)
    book.add(rolled)
    assert book.chain(digests[4], "a" * 64) == [rolled]
    assert book.chain(digests[5], "a" * 64) is None  # a peer on the abandoned weights gets the full ones
    many = StepLog(budget=10**9)
    for r in range(MAX_LINKS + 5):
        many.add(Step(r, str(r), str(r + 1), b"x"))
    assert len(many.steps) == MAX_LINKS


def reframed(message: bytes, edit: object) -> bytes:
    """``message`` with its header changed by ``edit`` (a function of the header dict) and its checksum fixed."""
    raw, payload = wire._unframe(message, b"PTD2")
    edit(raw)  # type: ignore[operator]
    return wire._frame(b"PTD2", raw, bytes(payload))


def test_every_wrong_chain_is_refused_with_its_code() -> None:
    codec = Codec("int8")
    weights, log, _ = steps(codec, 3)
    message = encode_chain(log, spec=SPEC, fingerprint=FINGERPRINT, codec=codec, round_index=3)

    def refused(data: bytes, held: np.ndarray | None = weights[0], fingerprint: str = FINGERPRINT) -> str:
        with pytest.raises(wire.WireError) as caught:
            apply_chain(data, held, spec=SPEC, fingerprint=fingerprint)
        return caught.value.code

    assert refused(message, weights[1]) == "wrong_base"  # a chain from other weights than those held
    assert refused(message, None) == "wrong_base"
    assert refused(message, fingerprint="e" * 16) == "fingerprint_mismatch"
    flipped = bytearray(message)
    flipped[-5] ^= 0x01
    assert refused(bytes(flipped)) == "checksum"  # damaged on the way
    assert refused(wire.reseal(bytes(flipped))) == "chain_mismatch"  # a payload altered and resealed

    def drop_last_byte_count(raw: dict) -> None:
        raw["links"][0]["bytes"] -= 1

    assert refused(reframed(message, drop_last_byte_count)) == "length_mismatch"

    def other_codec(raw: dict) -> None:
        raw["codec"] = {"name": "topk", "block": 256, "fraction": 0.5}

    assert refused(reframed(message, other_codec)) == "wrong_codec"  # its steps do not decode as topk

    payload = bytearray(wire._unframe(message, b"PTD2")[1])
    payload[0:4] = np.array([np.nan], dtype="<f4").tobytes()
    raw, _ = wire._unframe(message, b"PTD2")
    assert refused(wire._frame(b"PTD2", raw, bytes(payload))) == "wrong_codec"  # NaN scale

    def other_spec(raw: dict) -> None:
        raw["spec"]["shapes"] = [[301], [9]]

    assert refused(reframed(message, other_spec)) == "shape_mismatch"

    def no_links(raw: dict) -> None:
        raw["links"] = []

    assert refused(reframed(message, no_links)) == "malformed_header"

    def swapped(raw: dict) -> None:
        raw["links"][0], raw["links"][1] = raw["links"][1], raw["links"][0]

    assert refused(reframed(message, swapped)) == "wrong_base"
    assert ChainMismatch.http_status == 422
