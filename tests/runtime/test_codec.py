"""Update codecs (runtime.codec) against hand-computed encodings: int8 with stochastic rounding, top-k with
compact offsets, error feedback carried over three units, and every malformed payload refused with its code."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.codec import BLOCK, Codec, CodecError, ErrorFeedback


def test_int8_on_a_scale_of_one_is_exact_and_says_its_size() -> None:
    codec = Codec("int8", block=4)
    update = np.array([127, -127, 3, 0, 0, 0, 0, 0, 64, -1], dtype=np.float32)  # 3 blocks; the second all zero
    payload = codec.encode(update, seed=7)
    assert len(payload) == codec.payload_bytes(10) == 3 * 4 + 10
    scales = np.frombuffer(payload[:12], dtype="<f4")
    assert scales.tolist() == [1.0, 0.0, np.float32(64) / np.float32(127)]
    assert np.array_equal(codec.decode(payload, 10)[:8], update[:8])  # integers on a scale of 1: no rounding


def test_int8_rounds_stochastically_without_bias_and_deterministically() -> None:
    codec = Codec("int8", block=2)
    update = np.array([1.0, 0.3], dtype=np.float32)  # scale 1/127: 0.3 is 38.1 steps
    step = np.float32(1) / np.float32(127)
    decoded = np.array([codec.decode(codec.encode(update, seed), 2)[1] for seed in range(4000)])
    assert set(np.round(decoded / step).astype(int)) == {38, 39}  # floor or ceil, nothing else
    assert abs(decoded.mean() - 0.3) < 0.05 * step  # unbiased: 38.1 steps on average (its s.e.: 0.005 steps)
    assert codec.encode(update, 11) == codec.encode(update, 11)  # the unit's seed: the same bytes again
    assert len({codec.encode(update, seed) for seed in range(20)}) == 2


def test_int8_of_a_model_sized_update_is_within_one_step_per_block() -> None:
    rng = np.random.default_rng(0)
    update = (rng.standard_normal(10_000) * np.repeat(rng.uniform(0.001, 1, 40), 250)).astype(np.float32)
    codec = Codec("int8")
    decoded = codec.decode(codec.encode(update, 3), update.size)
    maxima = np.array([np.abs(update[i:i + BLOCK]).max() for i in range(0, update.size, BLOCK)])
    steps = np.repeat(maxima, BLOCK)[:update.size] / 127  # one quantization step per block
    assert (np.abs(decoded - update) <= steps * 1.0001).all()
    assert 4 * update.size / codec.payload_bytes(update.size) > 3.9


def test_topk_keeps_the_largest_entries_of_each_block_with_compact_offsets() -> None:
    codec = Codec("topk", fraction=0.25, block=8)
    update = np.array([0.5, -127, 2, 3, 0, 0, 127, 0,   # block 0 keeps 2: offsets 1 and 6
                       1, 1, 1, 1, 1, 1, 1, 1,          # block 1, ties: the lowest offsets 0 and 1
                       0, 0, 5], dtype=np.float32)      # block 2 (3 entries) keeps 1: offset 2
    payload = codec.encode(update, seed=1)
    assert len(payload) == codec.payload_bytes(update.size) == 3 * 4 + 5 * 2
    offsets = np.frombuffer(payload[12:17], dtype=np.uint8).tolist()
    assert offsets == [1, 6, 0, 1, 2]
    decoded = codec.decode(payload, update.size)
    expected = np.zeros_like(update)
    expected[[1, 6]] = [-127, 127]
    expected[[8, 9]] = 1
    expected[18] = 5
    assert np.allclose(decoded, expected, rtol=1e-6, atol=0)
    three_percent = Codec("topk", fraction=0.03)
    assert three_percent.payload_bytes(BLOCK) == 4 + 8 * 2 and 4 * BLOCK / three_percent.payload_bytes(BLOCK) > 50


def test_error_feedback_carries_what_topk_dropped_over_three_units() -> None:
    """Hand-computed, on scales of 1 (block maxima of 127), so every kept value is exact."""
    codec = Codec("topk", fraction=0.25, block=4)  # one entry per block
    feedback = ErrorFeedback(4)
    _, sent = feedback.encode(codec, np.array([127, 50, 0, 0], dtype=np.float32), seed=1)
    assert sent.tolist() == [127, 0, 0, 0] and feedback.residual.tolist() == [0, 50, 0, 0]
    _, sent = feedback.encode(codec, np.array([0, 77, 20, 0], dtype=np.float32), seed=2)  # 77 + 50 = 127
    assert sent.tolist() == [0, 127, 0, 0] and feedback.residual.tolist() == [0, 0, 20, 0]
    _, sent = feedback.encode(codec, np.array([0, 0, 107, -3], dtype=np.float32), seed=3)  # 107 + 20 = 127
    assert sent.tolist() == [0, 0, 127, 0] and feedback.residual.tolist() == [0, 0, 0, -3]


def test_error_feedback_loses_nothing_over_many_units() -> None:
    """Telescoping: what was sent plus the last residual is what the updates added up to."""
    rng = np.random.default_rng(1)
    codec, feedback = Codec("topk", fraction=0.05), ErrorFeedback(2000)
    total, sent = np.zeros(2000, np.float64), np.zeros(2000, np.float64)
    for unit in range(10):
        update = rng.standard_normal(2000).astype(np.float32)
        total += update
        sent += feedback.encode(codec, update, seed=unit)[1]
    assert np.allclose(sent + feedback.residual, total, atol=1e-4)


@pytest.mark.parametrize("codec", [Codec("int8"), Codec("topk")])
def test_a_non_finite_update_is_refused(codec: Codec) -> None:
    update = np.ones(300, np.float32)
    update[5] = np.nan
    with pytest.raises(CodecError) as refused:
        codec.encode(update, 0)
    assert refused.value.code == "non_finite"


def test_malformed_payloads_are_refused_with_their_codes() -> None:
    int8, topk = Codec("int8", block=4), Codec("topk", fraction=0.5, block=4)
    good = int8.encode(np.array([1, 2, 3, 4, 5], np.float32), 0)
    with pytest.raises(CodecError, match="bytes") as short:
        int8.decode(good[:-1], 5)
    assert short.value.code == "length_mismatch"
    nan_scale = np.array([np.nan, 1], dtype="<f4").tobytes() + good[8:]
    with pytest.raises(CodecError) as bad_scale:
        int8.decode(nan_scale, 5)
    assert bad_scale.value.code == "non_finite"
    payload = bytearray(topk.encode(np.array([1, 2, 3, 4, 5, 6], np.float32), 0))  # blocks of 4 and 2: keep 2 + 1
    payload[8 + 2] = 1  # the short block's offset: 1 is inside (2 entries)
    topk.decode(bytes(payload), 6)
    payload[8 + 2] = 2  # past its end
    with pytest.raises(CodecError, match="past the end"):
        topk.decode(bytes(payload), 6)
    payload[8 + 2], payload[8 + 1] = 1, payload[8]  # one entry named twice in block 0
    with pytest.raises(CodecError, match="twice"):
        topk.decode(bytes(payload), 6)
    for bad in ({"name": "zip"}, {"name": "topk", "fraction": 0}, {"name": "int8", "block": 512}, [1], {"x": 1}):
        with pytest.raises(CodecError) as refused:
            Codec.from_json(bad)
        assert refused.value.code == "bad_codec"
    assert Codec.from_json(Codec("topk", 0.1).to_json()) == Codec("topk", 0.1)


def test_topk_keeping_everything_is_int8_bit_for_bit() -> None:
    """An independent check of top-k's bookkeeping (offsets, scales, the order its noise is drawn in): keeping every
    entry must give exactly int8's decoding."""
    update = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    int8, everything = Codec("int8"), Codec("topk", fraction=1.0)
    expected = int8.decode(int8.encode(update, 5), 1000)
    assert np.array_equal(expected, everything.decode(everything.encode(update, 5), 1000))


def test_a_codec_without_error_feedback_keeps_no_residual() -> None:
    """int8's rounding error has mean zero, so nothing is carried: each update is encoded as it is."""
    codec, feedback = Codec("int8"), ErrorFeedback(300)
    rng = np.random.default_rng(2)
    for unit in range(3):
        update = rng.standard_normal(300).astype(np.float32)
        payload, sent = feedback.encode(codec, update, seed=unit)
        assert payload == codec.encode(update, unit) and np.array_equal(sent, codec.decode(payload, 300))
        assert not feedback.residual.any()
