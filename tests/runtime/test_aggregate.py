"""Aggregators against numbers computed by hand (the comments show the arithmetic), alone and under each merge."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest

from runtime.aggregate import (
    AGGREGATORS,
    Aggregator,
    CenteredClipping,
    Krum,
    Mean,
    Median,
    MultiKrum,
    TooFewResults,
    TrimmedMean,
    UnknownAggregator,
    aggregator_class,
    krum_scores,
    make_aggregator,
    trim_count,
)
from runtime.merge import (
    MERGES,
    FedAdam,
    FedAvg,
    FedAvgM,
    InvalidHyperparameter,
    MergeError,
    NonFiniteResult,
    Result,
    ResultSpecMismatch,
    StateDict,
    StateMismatch,
    fedadam_update,
    join_state,
    make_merge,
    split_state,
)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def results_of(*rows: Sequence[float], counts: Sequence[int] | None = None) -> list[Result]:
    counts = counts if counts is not None else [1] * len(rows)
    return [Result(f32(*row), count) for row, count in zip(rows, counts, strict=True)]


def column(*values: float) -> list[Result]:
    """One-coordinate results, one per value."""
    return results_of(*[(value,) for value in values])


# ---------------------------------------------------------------- mean


def old_weighted_average(vectors: Sequence[np.ndarray], counts: Sequence[int]) -> np.ndarray:
    """The merge methods' average before aggregators existed, copied verbatim: the reference for bit identity."""
    total = np.zeros(vectors[0].shape[0], dtype=np.float64)
    for vector, count in zip(vectors, counts, strict=True):
        total += count * vector.astype(np.float64)
    return total / sum(counts)


def test_mean_weights_by_examples_and_ignores_zero_example_results() -> None:
    results = results_of((1, 2), (5, 6), (1000, -1000), counts=[1, 3, 0])
    mean = Mean()
    # (1*1 + 3*5) / 4 = 4 ; (1*2 + 3*6) / 4 = 5 ; the third has weight 0
    averaged = mean.aggregate(f32(0, 0), results)
    assert averaged.dtype == np.float32
    np.testing.assert_array_equal(averaged, f32(4, 5))
    assert mean.last_outliers == ()


@pytest.mark.parametrize("seed", range(5))
def test_mean_is_the_old_weighted_mean_to_float64_rounding_and_the_same_in_any_order(seed: int) -> None:
    """The mean is now summed exactly (``runtime.aggregate.streaming``): the old float64 running sum, to its
    rounding, and the same bits for the results in any order (the old sum's last bits followed the order)."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=513).astype(np.float32)
    results = [
        Result((weights + rng.normal(0, rng.uniform(0.01, 10), weights.shape)).astype(np.float32),
               int(rng.integers(0, 100)) if i else 7)  # zero counts included, the total never zero
        for i in range(int(rng.integers(1, 9)))
    ]
    reference = old_weighted_average([r.weights for r in results], [r.num_examples for r in results])
    global64 = weights.astype(np.float64)
    combined = Mean().combine(global64, [r.weights for r in results], [r.num_examples for r in results])
    assert combined.dtype == np.float64
    np.testing.assert_allclose(combined, reference, rtol=1e-13, atol=1e-13)
    order = rng.permutation(len(results))
    shuffled = Mean().combine(global64, [results[i].weights for i in order], [results[i].num_examples for i in order])
    assert shuffled.tobytes() == combined.tobytes()
    assert Mean().aggregate(weights, results).tobytes() == combined.astype(np.float32).tobytes()
    # every merge method's default path is the Mean path
    for name in MERGES:
        assert make_merge(name).merge(weights, results).tobytes() == \
            make_merge(name).merge(weights, results, aggregator=Mean()).tobytes()
    assert FedAvg().merge(weights, results).tobytes() == reference.astype(np.float32).tobytes()
    zeros = np.zeros_like(global64)
    adam, _, _ = fedadam_update(global64, reference, zeros, zeros, 1, eta=0.01, beta_1=0.9, beta_2=0.99, tau=1e-3,
                                bias_correction=True)
    assert FedAdam().merge(weights, results).tobytes() == adam.astype(np.float32).tobytes()


# ---------------------------------------------------------------- median


def test_median_odd_k_is_unweighted() -> None:
    results = results_of((1, 10), (3, -2), (2, 4), counts=[100, 1, 1])
    # column 0: 1, 3, 2 -> 2 ; column 1: 10, -2, 4 -> 4 ; the 100 examples of the first change nothing
    np.testing.assert_array_equal(Median().aggregate(f32(0, 0), results), f32(2, 4))


def test_median_even_k_takes_the_mean_of_the_two_middle_values() -> None:
    results = results_of((1, 0, 7), (2, 0, 7), (10, 5, 7), (4, -1, 1))
    # column 0: 1 2 4 10 -> (2 + 4)/2 = 3 ; column 1: -1 0 0 5 -> 0 ; column 2 (ties): 1 7 7 7 -> 7
    median = Median()
    np.testing.assert_array_equal(median.aggregate(f32(0, 0, 0), results), f32(3, 0, 7))
    assert median.last_outliers == ()
    # a zero-example result takes no part: with it, k would be 5 and column 0's median 4
    with_idle = [*results, Result(f32(100, 100, 100), 0)]
    np.testing.assert_array_equal(median.aggregate(f32(0, 0, 0), with_idle), f32(3, 0, 7))


# ---------------------------------------------------------------- trimmed mean

# r0..r4; column 0: 1 2 3 4 100 ; column 1: 6 -50 3 0 9 (sorted: -50 r1, 0 r3, 3 r2, 6 r0, 9 r4)
TRIM_ROWS = ((1, 6), (2, -50), (3, 3), (4, 0), (100, 9))


def test_trimmed_mean_drops_one_value_at_each_end() -> None:
    trimmed = TrimmedMean(fraction=0.2)  # floor(0.2 * 5) = 1 at each end
    # column 0 keeps 2 3 4 -> 3 ; column 1 keeps 0 3 6 -> 3
    np.testing.assert_array_equal(trimmed.aggregate(f32(0, 0), results_of(*TRIM_ROWS)), f32(3, 3))
    # dropped: r0 in column 0, r1 in column 1, r4 in both: only r4 in more than half the columns
    assert trimmed.last_outliers == (4,)


def test_trimmed_mean_below_the_boundary_trims_nothing() -> None:
    trimmed = TrimmedMean(fraction=0.19)  # floor(0.95) = 0: the plain unweighted mean
    # column 0: 110 / 5 = 22 ; column 1: (6 - 50 + 3 + 0 + 9) / 5 = -32/5 = -6.4
    np.testing.assert_allclose(trimmed.aggregate(f32(0, 0), results_of(*TRIM_ROWS)), f32(22, -6.4), rtol=1e-7)
    assert trimmed.last_outliers == ()


def test_trimmed_mean_at_the_largest_trim_is_the_median() -> None:
    trimmed = TrimmedMean(fraction=0.4)  # floor(2.0) = 2: one value kept per column
    np.testing.assert_array_equal(trimmed.aggregate(f32(0, 0), results_of(*TRIM_ROWS)), f32(3, 3))
    # ranks (column 0, column 1): r0 (0, 3) r1 (1, 0) r2 (2, 2) r3 (3, 1) r4 (4, 4); ranks 0, 1, 3, 4 are dropped
    assert trimmed.last_outliers == (0, 1, 3, 4)


@pytest.mark.parametrize(
    "fraction, k, expected",
    [(0.2, 5, 1), (0.19, 5, 0), (0.25, 4, 1), (0.2, 4, 0), (0.0, 7, 0), (0.4, 5, 2), (0.29, 100, 29), (0.35, 180, 63)],
)
def test_trim_count_at_the_boundaries(fraction: float, k: int, expected: int) -> None:
    # 0.29 * 100 is 28.999999999999996 and 0.35 * 180 is 62.99999999999999 in floating point
    assert trim_count(fraction, k) == expected


def test_trimmed_mean_guards_float_error() -> None:
    # 29 zeros, 42 ones, 29 hundreds: trimming 29 at each end keeps the 42 ones -> 1
    # (trimming 28, as a bare floor(0.29 * 100) would, gives (0 + 42 + 100) / 44 = 3.23)
    values = [0.0] * 29 + [1.0] * 42 + [100.0] * 29
    np.testing.assert_array_equal(TrimmedMean(fraction=0.29).aggregate(f32(0), column(*values)), f32(1))


def test_trimmed_mean_ties_and_a_single_result() -> None:
    trimmed = TrimmedMean(fraction=0.34)  # floor(1.02) = 1
    # 5 (r0), 5 (r1), 1 (r2): sorted 1 r2, 5 r0, 5 r1 (ties keep the lower index first) -> keep 5
    np.testing.assert_array_equal(trimmed.aggregate(f32(0), column(5, 5, 1)), f32(5))
    assert trimmed.last_outliers == (1, 2)
    np.testing.assert_array_equal(TrimmedMean(fraction=0.49).aggregate(f32(0), column(8)), f32(8))  # floor(0.49) = 0


def test_trimmed_mean_must_keep_a_value() -> None:
    # 0.4999999999 * 2 + 1e-9 = 1.0000000008 -> 1 dropped at each end of 2
    with pytest.raises(TooFewResults, match="drops 1 of 2 values at each end"):
        TrimmedMean(fraction=0.4999999999).aggregate(f32(0), column(1, 2))


# ---------------------------------------------------------------- Krum and Multi-Krum

# k = 5, f = 1: each score sums the k - f - 2 = 2 smallest squared distances to the others
#   0: 1 (to 1) + 4 (to 2) = 5      1: 1 + 1 = 2      2: 1 + 1 = 2      3: 1 + 4 = 5
#   100: 97^2 + 98^2 = 9409 + 9604 = 19013
KRUM_VALUES = (0, 1, 2, 3, 100)


def test_krum_scores_are_squared_distances() -> None:
    matrix = np.array([[v] for v in KRUM_VALUES], dtype=np.float64)
    np.testing.assert_array_equal(krum_scores(matrix, 1), [5, 2, 2, 5, 19013])  # plain distances: 3 2 2 3 195


def test_krum_picks_the_lowest_score_lowest_index_on_ties() -> None:
    krum = Krum(f=1)
    np.testing.assert_array_equal(krum.aggregate(f32(0), column(*KRUM_VALUES)), f32(1))  # 1 and 2 tie at 2
    assert krum.last_outliers == (0, 2, 3, 4)
    # in two dimensions: (0,0) (1,0) (0,1) (1,1) all score 1 + 1 = 2; (10,10) scores 162 + 181 = 343
    square = results_of((0, 0), (1, 0), (0, 1), (1, 1), (10, 10))
    np.testing.assert_array_equal(krum.aggregate(f32(0, 0), square), f32(0, 0))
    np.testing.assert_array_equal(krum.aggregate(f32(0, 0), square[::-1]), f32(1, 1))


def test_multikrum_averages_the_best_m_unweighted() -> None:
    results = [Result(f32(v), n) for v, n in zip(KRUM_VALUES, (1, 1, 50, 1, 1), strict=True)]
    multi = MultiKrum(f=1)  # m = k - f = 4: scores 2, 2, 5, 5 -> results 0..3 -> (0 + 1 + 2 + 3) / 4 = 1.5
    np.testing.assert_array_equal(multi.aggregate(f32(0), results), f32(1.5))  # weighted: 106/53 = 2
    assert multi.last_outliers == (4,)
    three = MultiKrum(f=1, m=3)  # 1 and 2 (score 2), then 0 before 3 (tie at 5) -> (0 + 1 + 2) / 3 = 1
    np.testing.assert_array_equal(three.aggregate(f32(0), results), f32(1))
    assert three.last_outliers == (3, 4)
    np.testing.assert_array_equal(MultiKrum(f=1, m=1).aggregate(f32(0), results), Krum(f=1).aggregate(f32(0), results))


def test_krum_with_f_2_at_its_limit() -> None:
    # k = 7 = 2f + 3, 3 neighbours: 0: 1+4+9 = 14, 1: 1+1+4 = 6, 2: 6, 3: 6, 4: 14,
    # 50: 100 + 46^2 + 47^2 = 4425, 60: 100 + 56^2 + 57^2 = 6485
    values = (0, 1, 2, 3, 4, 50, 60)
    matrix = np.array([[v] for v in values], dtype=np.float64)
    np.testing.assert_array_equal(krum_scores(matrix, 2), [14, 6, 6, 6, 14, 4425, 6485])
    np.testing.assert_array_equal(Krum(f=2).aggregate(f32(0), column(*values)), f32(1))
    multi = MultiKrum(f=2)  # m = 5: results 0..4 -> 2
    np.testing.assert_array_equal(multi.aggregate(f32(0), column(*values)), f32(2))
    assert multi.last_outliers == (5, 6)
    with pytest.raises(TooFewResults, match="needs more than 2f \\+ 2 = 6 results, got 6"):
        Krum(f=2).aggregate(f32(0), column(*values[:6]))


@pytest.mark.parametrize("cls", [Krum, MultiKrum])
@pytest.mark.parametrize("f, works", [(0, 3), (1, 5), (3, 9)])
def test_krum_needs_more_than_2f_plus_2(cls: type[Krum] | type[MultiKrum], f: int, works: int) -> None:
    aggregator = cls(f=f)
    aggregator.aggregate(f32(0), column(*range(works)))
    assert aggregator.last_outliers != () or f == 0
    with pytest.raises(TooFewResults, match=f"got {works - 1}"):
        aggregator.aggregate(f32(0), column(*range(works - 1)))
    assert aggregator.last_outliers == ()  # a refused call leaves no stale outliers
    # a result with zero examples does not count towards k
    with pytest.raises(TooFewResults, match=f"got {works - 1}"):
        aggregator.aggregate(f32(0), [*column(*range(works - 1)), Result(f32(0.5), 0)])


def test_multikrum_m_above_k_is_refused() -> None:
    with pytest.raises(TooFewResults, match="m=6 needs at least 6 results, got 5"):
        MultiKrum(f=1, m=6).aggregate(f32(0), column(*KRUM_VALUES))


# ---------------------------------------------------------------- centered clipping

# round 1: global (1, 1), updates (3,4) (1,0) (-1,0) (0,2); v_0 = 0, radius 2.5:
#   (3,4) has norm 5 -> (1.5, 2); the others are within 2.5 -> v_1 = ((1.5,2) + (1,0) + (-1,0) + (0,2)) / 4
#   = (1.5, 4) / 4 = (0.375, 1) ; average = (1, 1) + v_1 = (1.375, 2)
ROUND_1 = results_of((4, 5), (2, 1), (0, 1), (1, 3))
# round 2 (after FedAvg the global is (1.375, 2)): results = global + v_1 + d_i with d = (6,8) (1,0) (-1,0) (0,0)
#   = (1.75, 3) + d_i ; (6,8) has norm 10 -> (1.5, 2) ; v_2 = v_1 + ((1.5,2) + (1,0) + (-1,0)) / 4
#   = (0.375, 1) + (0.375, 0.5) = (0.75, 1.5) ; average = (1.375, 2) + (0.75, 1.5) = (2.125, 3.5)
ROUND_2 = results_of((7.75, 11), (2.75, 3), (0.75, 3), (1.75, 3))


def test_centered_clipping_clips_around_the_last_aggregate() -> None:
    clipping = CenteredClipping(radius=2.5)
    g = FedAvg().merge(f32(1, 1), ROUND_1, aggregator=clipping)
    np.testing.assert_array_equal(g, f32(1.375, 2))
    assert clipping.last_outliers == (0,) and clipping.last_radius == 2.5
    np.testing.assert_array_equal(clipping.state_dict()["center"], [0.375, 1])
    np.testing.assert_array_equal(FedAvg().merge(g, ROUND_2, aggregator=clipping), f32(2.125, 3.5))
    assert clipping.last_outliers == (0,)
    np.testing.assert_array_equal(clipping.state_dict()["center"], [0.75, 1.5])
    # without the history round 2 would clip around the global weights and land elsewhere
    assert not np.array_equal(CenteredClipping(radius=2.5).aggregate(g, ROUND_2), f32(2.125, 3.5))


def test_centered_clipping_state_survives_a_restart_and_resets() -> None:
    first = CenteredClipping(radius=2.5)
    g = first.aggregate(f32(1, 1), ROUND_1)
    arrays, scalars = split_state(first.state_dict())
    assert sorted(arrays) == ["center"] and scalars == {} and arrays["center"].dtype == np.float64
    config = json.loads(json.dumps(first.to_config()))
    second = make_aggregator("centered_clipping", **config)
    second.load_state_dict(join_state({key: value.copy() for key, value in arrays.items()}, scalars))
    assert second.aggregate(g, ROUND_2).tobytes() == first.aggregate(g, ROUND_2).tobytes() == f32(2.125, 3.5).tobytes()
    first.reset()
    assert first.state_dict() == {} and first.last_outliers == () and first.last_radius is None
    second.load_state_dict({})
    assert second.state_dict() == {}


def test_centered_clipping_iterates() -> None:
    # global 0, results 10 0 0 0, radius 1. Iteration 1: clip(10) = 1 -> v = 1/4 = 0.25.
    # Iteration 2: 10 - 0.25 = 9.75 -> 1 ; 0 - 0.25 = -0.25 three times -> v = 0.25 + (1 - 0.75)/4 = 0.3125
    once, twice = CenteredClipping(radius=1.0), CenteredClipping(radius=1.0, iterations=2)
    np.testing.assert_array_equal(once.aggregate(f32(0), column(10, 0, 0, 0)), f32(0.25))
    np.testing.assert_array_equal(twice.aggregate(f32(0), column(10, 0, 0, 0)), f32(0.3125))
    assert twice.last_outliers == (0,)  # the last iteration's distances: 9.75, 0.25, 0.25, 0.25


def test_centered_clipping_default_radius_is_twice_the_median_distance() -> None:
    clipping = CenteredClipping()
    # distances from v_0 = 0: 1 1 2 100 -> median 1.5 -> radius 3 ; 100 -> 3 ; (1 - 1 + 2 + 3) / 4 = 1.25
    np.testing.assert_array_equal(clipping.aggregate(f32(0), column(1, -1, 2, 100)), f32(1.25))
    assert clipping.last_radius == 3.0 and clipping.last_outliers == (3,)


def test_centered_clipping_state_is_checked() -> None:
    clipping = CenteredClipping(radius=1.0)
    clipping.load_state_dict({"center": np.array([0.5])})
    bad: list[tuple[StateDict, str]] = [({"t": 1}, "only 'center'"), ({"center": np.zeros((2, 2))}, "1-D"),
                                        ({"center": np.array([np.nan])}, "non-finite")]
    for state, message in bad:
        with pytest.raises(StateMismatch, match=message):
            clipping.load_state_dict(state)
    np.testing.assert_array_equal(clipping.state_dict()["center"], [0.5])  # a refused state changes nothing
    with pytest.raises(StateMismatch, match="center has 1 values, weights have 2"):
        clipping.aggregate(f32(0, 0), results_of((1, 1)))


# ---------------------------------------------------------------- composition with the server optimizers


def test_median_under_fedadam_steps_on_the_medians_pseudo_gradient() -> None:
    merge = FedAdam(eta=0.5, beta_1=0.5, beta_2=0.75, tau=1.0, bias_correction=False)
    results = results_of((3, -1), (100, -50), (2.5, -1), counts=[1, 50, 1])
    # median (3, -1); delta = (3, -1) - (1, -1) = (2, 0); m = 0.5*(2, 0) = (1, 0); v = 0.25*(4, 0) = (1, 0)
    # step = 0.5 * m / (sqrt(v) + 1) = (0.25, 0) -> (1.25, -1)   (the weighted mean would be (96.2, -48.1))
    np.testing.assert_array_equal(merge.merge(f32(1, -1), results, aggregator=Median()), f32(1.25, -1))
    np.testing.assert_array_equal(merge.state_dict()["m"], [1, 0])
    np.testing.assert_array_equal(merge.state_dict()["v"], [1, 0])


def test_krum_under_fedavgm() -> None:
    merge = FedAvgM(server_learning_rate=0.5, server_momentum=0.5)
    # (0,3) scores 1 + 1 = 2 ; (1,3), (-1,3) and (0,4) score 1 + 2 = 3 ; (50,50) is far -> Krum picks (0,3)
    results = results_of((0, 3), (1, 3), (-1, 3), (0, 4), (50, 50), counts=[1, 1, 1, 1, 1000])
    # step = (1, 2) - (0, 3) = (1, -1) = momentum ; g = (1, 2) - 0.5*(1, -1) = (0.5, 2.5)
    np.testing.assert_array_equal(merge.merge(f32(1, 2), results, aggregator=Krum(f=1)), f32(0.5, 2.5))
    np.testing.assert_array_equal(merge.state_dict()["momentum"], [1, -1])


def test_trimmed_mean_under_fedavg() -> None:
    np.testing.assert_array_equal(
        FedAvg().merge(f32(9, 9), results_of(*TRIM_ROWS), aggregator=TrimmedMean(fraction=0.2)), f32(3, 3)
    )


class Spy(Mean):
    """A mean that counts its calls."""

    calls = 0

    def combine(self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]) -> np.ndarray:
        self.calls += 1
        return super().combine(global_weights, vectors, counts)


@pytest.mark.parametrize("merge_name", sorted(MERGES))
@pytest.mark.parametrize("bad_value", [np.nan, np.inf])
def test_non_finite_results_are_refused_before_aggregation(merge_name: str, bad_value: float) -> None:
    spy = Spy()
    with pytest.raises(NonFiniteResult, match="result 1 has 1 non-finite"):
        make_merge(merge_name).merge(f32(0, 0), results_of((1, 1), (1, bad_value)), aggregator=spy)
    assert spy.calls == 0
    make_merge(merge_name).merge(f32(0, 0), results_of((1, 1)), aggregator=spy)
    assert spy.calls == 1  # the spy does count


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_every_aggregator_checks_its_inputs_and_returns_float32(name: str) -> None:
    aggregator = make_aggregator(name, f=0) if name in ("krum", "multikrum") else make_aggregator(name)
    with pytest.raises(NonFiniteResult):
        aggregator.aggregate(f32(0, 0), results_of((1, 1), (1, np.nan), (0, 0)))
    with pytest.raises(ResultSpecMismatch, match="result 1 has shape \\[3\\]"):
        aggregator.aggregate(f32(0, 0), [*results_of((1, 1)), Result(f32(1, 1, 1), 1), *results_of((0, 0))])
    assert aggregator.state_dict() == {}  # refused rounds leave no state
    averaged = aggregator.aggregate(np.zeros(2, dtype=np.float32), results_of((1, 2), (1, 2), (1, 2)))
    assert averaged.dtype == np.float32 and averaged.shape == (2,)
    np.testing.assert_array_equal(averaged, f32(1, 2))  # identical results: every aggregator returns them


# ---------------------------------------------------------------- registry, configs and state


def test_registry() -> None:
    assert AGGREGATORS == {"mean": Mean, "median": Median, "trimmed_mean": TrimmedMean, "krum": Krum,
                           "multikrum": MultiKrum, "centered_clipping": CenteredClipping}
    assert all(cls.name == name for name, cls in AGGREGATORS.items())
    assert [name for name, cls in AGGREGATORS.items() if cls.is_stateful] == ["centered_clipping"]
    assert aggregator_class("krum") is Krum and isinstance(make_aggregator("mean"), Aggregator)
    message = "unknown aggregator 'avg'; choose one of mean, median, trimmed_mean, krum, multikrum, centered_clipping"
    with pytest.raises(UnknownAggregator, match=message) as caught:
        make_aggregator("avg")
    assert isinstance(caught.value, MergeError) and isinstance(caught.value, KeyError)


@pytest.mark.parametrize(
    "name, config",
    [
        ("mean", {}),
        ("median", {}),
        ("trimmed_mean", {"fraction": 0.25}),
        ("krum", {"f": 2}),
        ("multikrum", {"f": 1, "m": 3}),
        ("multikrum", {"f": 0, "m": None}),
        ("centered_clipping", {"radius": 0.5, "iterations": 3}),
        ("centered_clipping", {"radius": None}),
    ],
)
def test_config_json_round_trip(name: str, config: dict) -> None:
    aggregator = make_aggregator(name, **config)
    saved = json.loads(json.dumps(aggregator.to_config()))
    assert saved == aggregator.to_config()
    assert {key: saved[key] for key in config} == config
    assert aggregator_class(name).from_config(saved).to_config() == saved


def test_defaults() -> None:
    assert TrimmedMean().fraction == 0.2
    assert Krum().f == 1 and (MultiKrum().f, MultiKrum().m) == (1, None)
    assert (CenteredClipping().radius, CenteredClipping().iterations) == (None, 1)


@pytest.mark.parametrize(
    "name, config, message",
    [
        ("mean", {"f": 1}, "no hyperparameter 'f'"),
        ("trimmed_mean", {"fraction": 0.5}, "fraction must be < 0.5"),
        ("trimmed_mean", {"fraction": -0.1}, "fraction must be >= 0"),
        ("trimmed_mean", {"beta": 0.1}, "no hyperparameter 'beta'"),
        ("krum", {"f": -1}, "f must be >= 0"),
        ("krum", {"f": 1.5}, "f must be an integer"),
        ("krum", {"f": True}, "f must be an integer"),
        ("multikrum", {"m": 0}, "m must be >= 1"),
        ("centered_clipping", {"radius": 0}, "radius must be > 0"),
        ("centered_clipping", {"radius": float("inf")}, "radius must be a finite number"),
        ("centered_clipping", {"iterations": 0}, "iterations must be >= 1"),
    ],
)
def test_bad_hyperparameters_are_refused(name: str, config: dict, message: str) -> None:
    with pytest.raises(InvalidHyperparameter, match=message):
        make_aggregator(name, **config)


@pytest.mark.parametrize("name", [name for name, cls in AGGREGATORS.items() if not cls.is_stateful])
def test_stateless_aggregators_keep_no_state(name: str) -> None:
    aggregator = make_aggregator(name)
    assert aggregator.state_dict() == {}
    aggregator.load_state_dict({})
    with pytest.raises(StateMismatch, match="keeps no server state"):
        aggregator.load_state_dict({"center": np.zeros(1)})


@pytest.mark.parametrize("first", ["runtime.aggregate", "runtime.aggregate.krum", "runtime.merge.adaptive"])
def test_either_package_imports_first(first: str) -> None:
    """runtime.merge uses runtime.aggregate, which must never need runtime.merge (a fresh interpreter each)."""
    subprocess.run([sys.executable, "-c", f"import {first}"], check=True)


def test_centered_clipping_weighs_results_by_their_examples() -> None:
    """Two results, 1 and 3 examples, none clipped (tau = twice their median distance): the weighted mean, by
    hand (1*1 + 3*5) / 4 = 4 and (1*2 + 3*6) / 4 = 5, as FedAvg's; a small unit no longer weighs like a full one."""
    from runtime.aggregate import CenteredClipping

    clipping = CenteredClipping()
    averaged = clipping.aggregate(f32(0, 0), results_of((1, 2), (5, 6), counts=[1, 3]))
    np.testing.assert_allclose(averaged, f32(4, 5), rtol=1e-6)
    assert clipping.last_outliers == ()

