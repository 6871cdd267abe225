"""The exact, order-free sum and the round streamed as it arrives (``runtime.aggregate.streaming``): against
``math.fsum`` (the exactly rounded sum) as the oracle, in every order, and against the aggregators' all-at-once
``combine``."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
import pytest

from runtime.aggregate import CenteredClipping, Mean
from runtime.aggregate.streaming import GRID_BITS, MAX_TERMS, TERM_LIMIT, ExactSum, Stream, TermTooLarge


def terms(seed: int, k: int, n: int) -> tuple[list[np.ndarray], list[float]]:
    rng = np.random.default_rng(seed)
    vectors = [rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 2) for _ in range(k)]
    return vectors, [float(w) for w in rng.integers(1, 500, size=k)]


@pytest.mark.parametrize(("seed", "k", "n"), [(0, 1, 3), (1, 7, 50), (2, 40, 333)])
def test_the_sum_is_fsum_of_the_rounded_terms_in_any_order(seed: int, k: int, n: int) -> None:
    vectors, weights = terms(seed, k, n)
    grid = 2.0**-GRID_BITS
    # the oracle: each term rounded to the grid, then summed exactly and rounded once
    exact = [math.fsum(round(float(w * v[j]) / grid) * grid for v, w in zip(vectors, weights, strict=True))
             for j in range(n)]
    rng = np.random.default_rng(seed + 100)
    sums = []
    for _ in range(4):
        total = ExactSum(n)
        for i in rng.permutation(k):
            total.add(vectors[i], weights[i])
        sums.append(total.value())
    assert all(s.tobytes() == sums[0].tobytes() for s in sums)  # the same bits in every order
    np.testing.assert_allclose(sums[0], exact, rtol=2**-52, atol=0)
    plain = np.sum([w * v for v, w in zip(vectors, weights, strict=True)], axis=0)
    np.testing.assert_allclose(sums[0], plain, rtol=1e-12, atol=k * grid)


def test_a_term_taken_out_leaves_what_was_there_before_it() -> None:
    vectors, weights = terms(3, 6, 101)
    before = ExactSum(101)
    for v, w in zip(vectors[:5], weights[:5], strict=True):
        before.add(v, w)
    after = ExactSum(101)
    for i in (4, 0, 5, 2, 1, 3):
        after.add(vectors[i], weights[i])
    after.subtract(vectors[5], weights[5])
    assert after.value().tobytes() == before.value().tobytes() and after.terms == 5


def test_a_term_too_large_or_not_finite_is_refused_and_changes_nothing() -> None:
    total = ExactSum(3)
    total.add(np.array([1.0, 2.0, 3.0]))
    kept = total.value()
    for bad in (np.array([0.0, TERM_LIMIT, 0.0]), np.array([np.nan, 0.0, 0.0]), np.array([np.inf, 0.0, 0.0])):
        with pytest.raises(TermTooLarge, match="can be summed exactly"):
            total.add(bad)
    with pytest.raises(TermTooLarge):
        total.add(np.array([0.0, TERM_LIMIT / 2**10, 0.0]), 2.0**10)  # (the weight counts)
    assert total.value().tobytes() == kept.tobytes() and total.terms == 1
    with pytest.raises(ValueError, match="shape"):
        total.add(np.zeros(4))


def test_the_limbs_hold_the_most_terms_at_the_largest_value() -> None:
    big = np.array([TERM_LIMIT - 0.5, -(TERM_LIMIT - 0.25)])
    one = ExactSum(2)
    one.add(big)
    total = ExactSum(2)
    high, low = one.limbs
    total.limbs = high * (MAX_TERMS - 1), low * (MAX_TERMS - 1)  # (what MAX_TERMS - 1 adds hold)
    total.terms = MAX_TERMS - 1
    total.add(big)
    np.testing.assert_allclose(total.value(), big * MAX_TERMS, rtol=1e-9)
    with pytest.raises(TermTooLarge, match="at most"):
        total.add(big)


@pytest.mark.parametrize("aggregator", [Mean, CenteredClipping])
def test_a_round_streamed_in_arrival_order_gives_combines_bits(aggregator: type) -> None:
    rng = np.random.default_rng(7)
    n, k = 1000, 30
    global_weights = rng.standard_normal(n).astype(np.float32)
    vectors = [global_weights + rng.standard_normal(n).astype(np.float32) * 0.1 for _ in range(k)]
    vectors[3] = global_weights + rng.standard_normal(n).astype(np.float32) * 20  # far: clipped
    vectors[11] = global_weights - 30 * (vectors[0] - global_weights)  # flipped and scaled: clipped
    counts = [int(c) for c in rng.integers(0, 60, size=k)]
    counts[3] = counts[11] = 50
    at_once, streamed = aggregator(), aggregator()
    global64 = global_weights.astype(np.float64)
    for round_index in range(3):  # (the center carries from round to round)
        expected = at_once.combine(global64, vectors, counts)
        stream = streamed.open_stream(global64)
        for slot in rng.permutation(k):
            stream.add(int(slot), vectors[slot], counts[slot])
        reread: list[object] = []

        def read_again(key: object, seen: list[object] = reread) -> np.ndarray:
            seen.append(key)
            return vectors[int(key)]  # type: ignore[call-overload]

        average, outliers = streamed.finish_stream(stream, read_again)
        assert average.tobytes() == expected.tobytes(), round_index
        assert sorted(outliers) == sorted(reread) == list(at_once.last_outliers)
        if aggregator is CenteredClipping:
            assert set(outliers) == {3, 11} and at_once.last_radius == streamed.last_radius
            assert at_once.state_dict()["center"].tobytes() == streamed.state_dict()["center"].tobytes()
        else:
            assert outliers == []


def test_a_result_removed_before_the_finish_is_as_if_it_never_came() -> None:
    rng = np.random.default_rng(8)
    global64 = np.zeros(50)
    vectors = [rng.standard_normal(50) for _ in range(5)]
    whole = Stream(global64, np.zeros(50))
    for slot in (0, 1, 2, 4):
        whole.add(slot, vectors[slot], 10)
    dropped = Stream(global64, np.zeros(50))
    for slot in (4, 3, 2, 1, 0):
        dropped.add(slot, vectors[slot], 10)
    dropped.remove(3, vectors[3])
    assert dropped.taking_part() == [0, 1, 2, 4]
    assert dropped.clipped_mean(None, vectors.__getitem__)[0].tobytes() == \
        whole.clipped_mean(None, vectors.__getitem__)[0].tobytes()
    with pytest.raises(ValueError, match="already"):
        dropped.add(0, vectors[0], 10)


def test_more_iterations_do_not_stream() -> None:
    assert CenteredClipping().streams() and Mean().streams() and not CenteredClipping(iterations=2).streams()
    with pytest.raises(NotImplementedError, match="every result"):
        CenteredClipping(iterations=2).open_stream(np.zeros(3))


def test_contributions_prepared_in_threads_give_the_same_bits_and_a_foreign_one_is_not_trusted() -> None:
    """What a relay does as results arrive: each result's part of the sum computed in a worker thread (several at
    once), then added on the event loop in whatever order the threads finished. The bits are those of adding each
    result whole; a part prepared for another round's stream, or for another example count, is computed again."""
    rng = np.random.default_rng(9)
    n, k = 2000, 24
    global64 = rng.standard_normal(n)
    vectors = [(global64 + rng.standard_normal(n) * 0.1).astype(np.float32) for _ in range(k)]
    counts = [int(c) for c in rng.integers(0, 40, size=k)]  # (some with no examples: no term)
    expected = CenteredClipping()
    whole = expected.open_stream(global64)
    for slot in range(k):
        whole.add(slot, vectors[slot], counts[slot])
    summed = CenteredClipping()
    stream = summed.open_stream(global64)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {pool.submit(stream.prepare, vectors[slot], counts[slot]): slot for slot in rng.permutation(k)}
        for future in as_completed(futures):
            slot = futures[future]
            contribution = future.result()
            assert (contribution.term is None) == (counts[slot] == 0)
            stream.add(slot, vectors[slot], counts[slot], contribution)
    assert stream.total.value().tobytes() == whole.total.value().tobytes()
    assert stream.distances == whole.distances
    assert summed.finish_stream(stream, vectors.__getitem__)[0].tobytes() == \
        expected.finish_stream(whole, vectors.__getitem__)[0].tobytes()
    # a part computed for another stream (another round's center) or another count is not the one added
    other = Stream(global64 + 1.0, np.zeros(n))
    fresh = Stream(global64, np.zeros(n))
    fresh.add(0, vectors[0], 5, other.prepare(vectors[0], 5))
    fresh.add(1, vectors[1], 5, fresh.prepare(vectors[1], 7))
    alone = Stream(global64, np.zeros(n))
    alone.add(0, vectors[0], 5)
    alone.add(1, vectors[1], 5)
    assert fresh.total.value().tobytes() == alone.total.value().tobytes() and fresh.distances == alone.distances


def test_results_renamed_keep_their_sum_and_distances_and_a_bad_renaming_changes_nothing() -> None:
    """An asynchronous relay sums results under their arrival numbers and merges them under their places in the
    merge: the renamed stream finishes to the bits of one built under the new names."""
    rng = np.random.default_rng(3)
    n = 500
    global64 = rng.standard_normal(n)
    vectors = {seq: (global64 + rng.standard_normal(n) * (3.0 if seq == 40 else 0.1)).astype(np.float32)
               for seq in (17, 23, 40)}
    by_arrival, by_place = CenteredClipping(), CenteredClipping()
    arrived, placed = by_arrival.open_stream(global64), by_place.open_stream(global64)
    for place, seq in enumerate(sorted(vectors)):
        arrived.add(seq, vectors[seq], 10 + place)
        placed.add(place, vectors[seq], 10 + place)
    with pytest.raises(ValueError):
        arrived.rekey({17: 0, 23: 0, 40: 2})  # (two results, one name)
    with pytest.raises(ValueError):
        arrived.rekey({17: 0, 23: 1})  # (a result left unnamed)
    assert set(arrived.counts) == {17, 23, 40}
    arrived.rekey({17: 0, 23: 1, 40: 2})
    assert arrived.counts == placed.counts and arrived.distances == placed.distances
    reread = {place: vectors[seq] for place, seq in enumerate(sorted(vectors))}.__getitem__
    merged, clipped = by_arrival.finish_stream(arrived, reread)
    assert merged.tobytes() == by_place.finish_stream(placed, reread)[0].tobytes() and list(clipped) == [2]


def test_one_limb_and_two_limbs_hold_the_same_integer() -> None:
    """Small terms are summed in one int64 limb, a large one moves the sum to two: the bits of the value do not
    depend on which held it, and a large term taken out again leaves the small terms' bits."""
    vectors, weights = terms(5, 9, 257)
    small = ExactSum(257)
    for v, w in zip(vectors, weights, strict=True):
        small.add(v, w)
    assert small.single is not None  # (their peaks sum far below 2^22)
    forced = ExactSum(257)
    forced.limbs  # noqa: B018  (reading the limbs moves the sum to two of them)
    assert forced.single is None
    for v, w in zip(vectors, weights, strict=True):
        forced.add(v, w)
    large = np.zeros(257)
    large[7] = 2.0**30  # (a term beyond one limb's share)
    mixed = ExactSum(257)
    for i, (v, w) in enumerate(zip(vectors, weights, strict=True)):
        mixed.add(v, w)
        if i == 3:
            mixed.add(large, 3.0)
    assert mixed.single is None
    mixed.subtract(large, 3.0)
    assert small.value().tobytes() == forced.value().tobytes() == mixed.value().tobytes()
    copied = small.copy()
    copied.add(large)
    assert small.single is not None and copied.single is None and copied.value()[7] == small.value()[7] + 2.0**30
