"""Merge methods against numbers computed by hand (the comments show the arithmetic)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.merge import (
    MERGES,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedYogi,
    InvalidExampleCount,
    InvalidHyperparameter,
    MergeMethod,
    NonFiniteResult,
    NoResults,
    Result,
    ResultSpecMismatch,
    StateMismatch,
    UnknownMerge,
    ZeroTotalExamples,
    join_state,
    make_merge,
    split_state,
)
from runtime.weights import WeightSpec


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def one(*values: float) -> list[Result]:
    return [Result(f32(*values), 10)]


# ---------------------------------------------------------------- FedAvg


def test_fedavg_weights_by_examples() -> None:
    results = [Result(f32(1, 2), 1), Result(f32(5, 6), 3)]
    merged = FedAvg().merge(f32(0, 0), results)
    # (1*1 + 3*5) / 4 = 16/4 = 4 ; (1*2 + 3*6) / 4 = 20/4 = 5
    assert merged.dtype == np.float32
    np.testing.assert_array_equal(merged, f32(4, 5))


def test_fedavg_ignores_global_and_zero_example_results() -> None:
    results = [Result(f32(0.1), 1), Result(f32(0.2), 2), Result(f32(1000), 0)]
    # (0.1 + 2*0.2) / 3 = 0.5/3 = 0.1666...
    np.testing.assert_allclose(FedAvg().merge(f32(7), results), f32(0.16666667), rtol=1e-7)


def test_fedavg_accumulates_in_float64() -> None:
    results = [Result(f32(16777216), 1), Result(f32(1), 1), Result(f32(1), 1)]
    # float64: (2**24 + 1 + 1) / 3 = 16777218 / 3 = 5592406, exact in float32.
    # A float32 sum would lose both ones (2**24 + 1 rounds back to 2**24) and give 5592405.5.
    np.testing.assert_array_equal(FedAvg().merge(f32(0), results), f32(5592406))


# ---------------------------------------------------------------- FedAvgM

# Three rounds, one result per round (so avg = result), server_learning_rate 0.5, server_momentum 0.5.
FEDAVGM_AVERAGES = [(0.0, 3.0), (0.5, 4.5), (1.25, 3.75)]


def test_fedavgm_three_rounds() -> None:
    merge = FedAvgM(server_learning_rate=0.5, server_momentum=0.5)
    g = f32(1, 2)
    # round 1: step = g - avg = (1-0, 2-3) = (1, -1); m = 0.5*0 + (1, -1) = (1, -1)
    #          g = (1, 2) - 0.5*(1, -1) = (0.5, 2.5)
    # (two results with 1 and 3 examples whose average is (0, 3): (-3 + 3*1)/4 = 0, (0 + 3*4)/4 = 3)
    g = merge.merge(g, [Result(f32(-3, 0), 1), Result(f32(1, 4), 3)])
    np.testing.assert_array_equal(g, f32(0.5, 2.5))
    np.testing.assert_array_equal(merge.state_dict()["momentum"], [1, -1])
    # round 2: step = (0.5-0.5, 2.5-4.5) = (0, -2); m = 0.5*(1, -1) + (0, -2) = (0.5, -2.5)
    #          g = (0.5, 2.5) - 0.5*(0.5, -2.5) = (0.25, 3.75)
    g = merge.merge(g, one(0.5, 4.5))
    np.testing.assert_array_equal(g, f32(0.25, 3.75))
    np.testing.assert_array_equal(merge.state_dict()["momentum"], [0.5, -2.5])
    # round 3: step = (0.25-1.25, 3.75-3.75) = (-1, 0); m = 0.5*(0.5, -2.5) + (-1, 0) = (-0.75, -1.25)
    #          g = (0.25, 3.75) - 0.5*(-0.75, -1.25) = (0.625, 4.375)
    g = merge.merge(g, one(1.25, 3.75))
    np.testing.assert_array_equal(g, f32(0.625, 4.375))
    state = merge.state_dict()
    assert state["t"] == 3
    np.testing.assert_array_equal(state["momentum"], [-0.75, -1.25])


def test_fedavgm_nesterov_three_rounds() -> None:
    merge = FedAvgM(server_learning_rate=0.5, server_momentum=0.5, nesterov=True)
    g = f32(1, 2)
    # round 1: step = (1, -1); m = (1, -1); direction = 0.5*m + step = (1.5, -1.5)
    #          g = (1, 2) - 0.5*(1.5, -1.5) = (0.25, 2.75)
    g = merge.merge(g, one(0.0, 3.0))
    np.testing.assert_array_equal(g, f32(0.25, 2.75))
    # round 2: step = (0.25-0.5, 2.75-4.5) = (-0.25, -1.75); m = 0.5*(1, -1) + step = (0.25, -2.25)
    #          direction = 0.5*(0.25, -2.25) + step = (-0.125, -2.875); g = (0.25, 2.75) - 0.5*direction
    #          = (0.3125, 4.1875)
    g = merge.merge(g, one(0.5, 4.5))
    np.testing.assert_array_equal(g, f32(0.3125, 4.1875))
    # round 3: step = (0.3125-1.25, 4.1875-3.75) = (-0.9375, 0.4375); m = 0.5*(0.25, -2.25) + step
    #          = (-0.8125, -0.6875); direction = 0.5*m + step = (-1.34375, 0.09375)
    #          g = (0.3125, 4.1875) - 0.5*direction = (0.984375, 4.140625)
    g = merge.merge(g, one(1.25, 3.75))
    np.testing.assert_array_equal(g, f32(0.984375, 4.140625))
    np.testing.assert_array_equal(merge.state_dict()["momentum"], [-0.8125, -0.6875])


def test_fedavgm_defaults_and_first_round() -> None:
    merge = FedAvgM()
    assert (merge.server_learning_rate, merge.server_momentum, merge.nesterov) == (1.0, 0.9, False)
    # round 1 with lr 1: m = step, g = g - step = avg; round 2: step = (1), m = 0.9*(-2) + 1 = -0.8,
    # g = 2 - (-0.8) = 2.8
    g = merge.merge(f32(0), one(2))
    np.testing.assert_array_equal(g, f32(2))
    np.testing.assert_allclose(merge.merge(g, one(1)), f32(2.8), rtol=1e-7)


def test_fedavgm_without_momentum_is_fedavg() -> None:
    results = [Result(f32(1, 2), 1), Result(f32(5, 6), 3)]
    np.testing.assert_array_equal(FedAvgM(server_momentum=0.0).merge(f32(9, 9), results), f32(4, 5))


# ---------------------------------------------------------------- FedAdam
# eta 0.5, beta_1 0.5, beta_2 0.75, tau 1. Each round's result is global + delta, deltas chosen so the
# square roots come out exact. Coordinate 0: delta = 2, 1, -1. Coordinate 1: delta = 0, 2, 1.


def test_fedadam_three_rounds_without_bias_correction() -> None:
    merge = FedAdam(eta=0.5, beta_1=0.5, beta_2=0.75, tau=1.0, bias_correction=False)
    g = f32(1, -1)
    # round 1: delta = (2, 0); m = 0.5*(2, 0) = (1, 0); v = 0.25*(4, 0) = (1, 0)
    #          step = 0.5 * m / (sqrt(v) + 1) = (0.5*1/2, 0) = (0.25, 0); g = (1.25, -1)
    g = merge.merge(g, one(3, -1))
    np.testing.assert_array_equal(g, f32(1.25, -1))
    np.testing.assert_array_equal(merge.state_dict()["m"], [1, 0])
    np.testing.assert_array_equal(merge.state_dict()["v"], [1, 0])
    # round 2: delta = (1, 2); m = 0.5*(1, 0) + 0.5*(1, 2) = (1, 1); v = 0.75*(1, 0) + 0.25*(1, 4) = (1, 1)
    #          step = 0.5 * (1, 1) / (1 + 1) = (0.25, 0.25); g = (1.5, -0.75)
    g = merge.merge(g, one(2.25, 1))
    np.testing.assert_array_equal(g, f32(1.5, -0.75))
    # round 3: delta = (-1, 1); m = 0.5*(1, 1) + 0.5*(-1, 1) = (0, 1); v = 0.75*(1, 1) + 0.25*(1, 1) = (1, 1)
    #          step = 0.5 * (0, 1) / 2 = (0, 0.25); g = (1.5, -0.5)
    # (coordinate 0 guards against flower#893: with delta in place of m the step would be -0.25, not 0)
    g = merge.merge(g, one(0.5, 0.25))
    np.testing.assert_array_equal(g, f32(1.5, -0.5))
    state = merge.state_dict()
    assert state["t"] == 3
    np.testing.assert_array_equal(state["m"], [0, 1])
    np.testing.assert_array_equal(state["v"], [1, 1])


def test_fedadam_three_rounds_with_bias_correction() -> None:
    merge = FedAdam(eta=0.5, beta_1=0.5, beta_2=0.75, tau=0.5, bias_correction=True)
    # Coordinate 0: delta = 2, 5, 4. Coordinate 1: the same, negated. Coordinate 2: delta always 0.
    # 1 - beta_1**t = 0.5, 0.75, 0.875 ; 1 - beta_2**t = 0.25, 0.4375, 0.578125
    # m = 1, 0.5*1 + 0.5*5 = 3, 0.5*3 + 0.5*4 = 3.5        -> m_hat = 1/0.5 = 2, 3/0.75 = 4, 3.5/0.875 = 4
    # v = 0.25*4 = 1, 0.75*1 + 0.25*25 = 7, 0.75*7 + 0.25*16 = 9.25
    #                                   -> v_hat = 1/0.25 = 4, 7/0.4375 = 16, 9.25/0.578125 = 16
    # step = 0.5 * m_hat / (sqrt(v_hat) + 0.5) = 0.5*2/2.5 = 0.4, 0.5*4/4.5 = 4/9, 4/9
    g = f32(1, -1, 0.5)
    expected = [(1.4, -1.4), (1.4 + 4 / 9, -1.4 - 4 / 9), (1.4 + 8 / 9, -1.4 - 8 / 9)]
    for delta, (plus, minus) in zip((2.0, 5.0, 4.0), expected, strict=True):
        average = g.astype(np.float64) + [delta, -delta, 0.0]
        g = merge.merge(g, [Result(average.astype(np.float32), 1)])
        np.testing.assert_allclose(g, f32(plus, minus, 0.5), rtol=2e-7)
    state = merge.state_dict()
    assert state["t"] == 3
    # deltas pass through float32 globals, so the moments are exact only to float32 precision
    np.testing.assert_allclose(state["m"], [3.5, -3.5, 0.0], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(state["v"], [9.25, 9.25, 0.0], rtol=1e-6, atol=1e-12)


def test_fedadam_defaults_first_round() -> None:
    merge = FedAdam()
    assert (merge.eta, merge.beta_1, merge.beta_2, merge.tau, merge.bias_correction) == (0.01, 0.9, 0.99, 1e-3, True)
    # with bias correction round 1 gives m_hat = delta, sqrt(v_hat) = |delta|:
    # step = 0.01 * delta / (|delta| + 0.001): 0.005/0.501 = 0.00998004, -0.0002/0.021 = -0.00952381
    merged = merge.merge(f32(0, 0), one(0.5, -0.02))
    np.testing.assert_allclose(merged, f32(0.00998004, -0.00952381), rtol=1e-6)


# ---------------------------------------------------------------- state save / restore


def run_rounds(merge: MergeMethod, weights: np.ndarray, rounds: range, seed: int = 0) -> np.ndarray:
    for round_index in rounds:
        rng = np.random.default_rng([seed, round_index])
        results = [
            Result((weights + rng.normal(0, 0.1, weights.shape)).astype(np.float32), int(rng.integers(1, 50)))
            for _ in range(3)
        ]
        weights = merge.merge(weights, results)
    return weights


@pytest.mark.parametrize(
    "name, hyperparameters",
    [
        ("fedavg", {}),
        ("fedavgm", {"server_momentum": 0.9}),
        ("fedavgm", {"server_learning_rate": 0.7, "nesterov": True}),
        ("fedadam", {"eta": 0.03}),
        ("fedadam", {"bias_correction": False}),
        ("fedyogi", {"eta": 0.03}),
        ("fedadagrad", {"eta": 0.05, "beta_1": 0.0}),
        ("fedavg", {"server_learning_rate": 1.5}),
    ],
)
def test_resume_mid_session_is_bit_identical(name: str, hyperparameters: dict) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    start = np.random.default_rng(1).normal(size=257).astype(np.float32)
    uninterrupted = run_rounds(make_merge(name, **hyperparameters), start, range(6))

    first = make_merge(name, **hyperparameters)
    halfway = run_rounds(first, start, range(3))
    arrays, scalars = split_state(first.state_dict())
    saved_arrays = safetensors_numpy.save(arrays) if arrays else b""
    saved_scalars = json.dumps(scalars)
    saved_config = json.dumps({"name": first.name, "hyperparameters": first.to_config()})

    config = json.loads(saved_config)
    second = make_merge(config["name"], **config["hyperparameters"])
    loaded_arrays = safetensors_numpy.load(saved_arrays) if saved_arrays else {}
    second.load_state_dict(join_state(loaded_arrays, json.loads(saved_scalars)))
    resumed = run_rounds(second, halfway, range(3, 6))
    assert resumed.tobytes() == uninterrupted.tobytes()


def test_state_dict_shapes() -> None:
    assert FedAvg().state_dict() == {}
    assert FedAvgM().state_dict() == {"t": 0}
    assert FedAdam().state_dict() == {"t": 0}
    adam = FedAdam()
    adam.merge(f32(0, 0), one(1, 1))
    arrays, scalars = split_state(adam.state_dict())
    assert scalars == {"t": 1} and sorted(arrays) == ["m", "v"]
    assert all(array.dtype == np.float64 for array in arrays.values())
    adam.reset()
    assert adam.state_dict() == {"t": 0}


@pytest.mark.parametrize(
    "merge, state, message",
    [
        (FedAvg(), {"t": 1}, "keeps no server state"),
        (FedAvgM(), {"momentum": np.zeros(2)}, "needs 't'"),
        (FedAvgM(), {"t": 2}, "no momentum"),
        (FedAvgM(), {"t": 1, "momentum": np.zeros((2, 2))}, "1-D"),
        (FedAvgM(), {"t": -1}, "'t' must be"),
        (FedAdam(), {"t": 1, "m": np.zeros(2)}, "needs 't'"),
        (FedAdam(), {"t": 1, "m": np.zeros(2), "v": np.zeros(3)}, "'v' has 3 values, expected 2"),
        (FedAdam(), {"t": 1, "m": np.zeros(2), "v": -np.ones(2)}, "negative"),
        (FedAdam(), {"t": 1, "m": np.full(2, np.nan), "v": np.ones(2)}, "non-finite"),
        (FedAdam(), {"t": 0, "m": np.zeros(2), "v": np.zeros(2)}, "t=0 with moments"),
    ],
)
def test_bad_state_is_refused(merge: MergeMethod, state: dict, message: str) -> None:
    with pytest.raises(StateMismatch, match=message):
        merge.load_state_dict(state)


def test_state_of_other_length_is_refused_at_merge() -> None:
    merge = FedAvgM()
    merge.load_state_dict({"t": 1, "momentum": np.zeros(3)})
    with pytest.raises(StateMismatch, match="3 values, weights have 2"):
        merge.merge(f32(0, 0), one(1, 1))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name", sorted(MERGES))
def test_mismatched_length_is_refused(name: str) -> None:
    merge = make_merge(name)
    with pytest.raises(ResultSpecMismatch, match="result 1 has shape \\[3\\]"):
        merge.merge(f32(0, 0), [Result(f32(1, 1), 1), Result(f32(1, 1, 1), 1)])
    with pytest.raises(ResultSpecMismatch, match="result 0 has shape \\[1, 2\\]"):
        merge.merge(f32(0, 0), [Result(np.ones((1, 2), dtype=np.float32), 1)])  # would broadcast
    with pytest.raises(ResultSpecMismatch, match="1-D"):
        merge.merge(np.zeros((1, 2), dtype=np.float32), one(1, 1))
    assert merge.state_dict() in ({}, {"t": 0})  # a refused round leaves the state alone


@pytest.mark.parametrize("name", sorted(MERGES))
@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
def test_non_finite_result_is_refused(name: str, bad_value: float) -> None:
    with pytest.raises(NonFiniteResult, match="result 1 has 1 non-finite"):
        make_merge(name).merge(f32(0, 0), [Result(f32(1, 1), 1), Result(f32(1, bad_value), 1)])


@pytest.mark.parametrize("name", sorted(MERGES))
def test_empty_and_zero_example_rounds_are_refused(name: str) -> None:
    with pytest.raises(NoResults):
        make_merge(name).merge(f32(0), [])
    with pytest.raises(ZeroTotalExamples, match="2 results report zero examples"):
        make_merge(name).merge(f32(0), [Result(f32(1), 0), Result(f32(2), 0)])
    with pytest.raises(InvalidExampleCount, match="num_examples=-1"):
        make_merge(name).merge(f32(0), [Result(f32(1), -1)])
    with pytest.raises(InvalidExampleCount, match="num_examples=1.5"):
        make_merge(name).merge(f32(0), [Result(f32(1), 1.5)])  # type: ignore[arg-type]


def test_result_spec_is_checked() -> None:
    spec = WeightSpec((("w", (2,)),))
    other = WeightSpec((("u", (2,)),))
    with pytest.raises(ResultSpecMismatch, match="spec differs"):
        FedAvg().merge(f32(0, 0), [Result(f32(1, 1), 1, spec=other)], spec=spec)
    with pytest.raises(ResultSpecMismatch, match="its spec says 3"):
        FedAvg().merge(f32(0, 0), [Result(f32(1, 1), 1, spec=WeightSpec((("w", (3,)),)))])
    with pytest.raises(ResultSpecMismatch, match="spec needs 2"):
        FedAvg().merge(f32(0, 0, 0), one(1, 1, 1), spec=spec)


# ---------------------------------------------------------------- configs and names


@pytest.mark.parametrize(
    "name, hyperparameters",
    [
        ("fedavg", {}),
        ("fedavgm", {"server_learning_rate": 0.5, "server_momentum": 0.0, "nesterov": True}),
        ("fedadam", {"eta": 0.03, "beta_1": 0.8, "beta_2": 0.999, "tau": 1e-4, "bias_correction": False}),
        ("fedyogi", {"eta": 0.02, "tau": 1e-2}),
        ("fedadagrad", {"eta": 0.1, "beta_1": 0.0, "bias_correction": False}),
        ("fedavg", {"server_learning_rate": 2.0}),
    ],
)
def test_config_json_round_trip(name: str, hyperparameters: dict) -> None:
    merge = make_merge(name, **hyperparameters)
    assert merge.name == name
    config = json.loads(json.dumps(merge.to_config()))
    assert config == merge.to_config()
    assert {key: config[key] for key in hyperparameters} == hyperparameters
    assert type(merge).from_config(config).to_config() == config


def test_registry_and_statefulness() -> None:
    assert MERGES == {"fedavg": FedAvg, "fedavgm": FedAvgM, "fedadam": FedAdam, "fedyogi": FedYogi,
                      "fedadagrad": FedAdagrad}
    assert [m.is_stateful for m in MERGES.values()] == [False, True, True, True, True]
    with pytest.raises(UnknownMerge, match="unknown merge method 'fedprox'; choose one of fedavg, fedavgm, fedadam, "
                                           "fedyogi, fedadagrad"):
        make_merge("fedprox")


@pytest.mark.parametrize(
    "name, hyperparameters, message",
    [
        ("fedavg", {"server_momentum": 0.9}, "no hyperparameter 'server_momentum'"),
        ("fedavg", {"server_learning_rate": 0}, "server_learning_rate must be > 0"),
        ("fedyogi", {"beta_2": 1.0}, "beta_2 must be < 1"),
        ("fedadagrad", {"tau": 0}, "tau must be > 0"),
        ("fedavgm", {"server_momentum": 1.0}, "server_momentum must be < 1"),
        ("fedavgm", {"server_learning_rate": 0}, "server_learning_rate must be > 0"),
        ("fedavgm", {"nesterov": 1}, "nesterov must be true or false"),
        ("fedadam", {"eta": -0.1}, "eta must be > 0"),
        ("fedadam", {"beta_2": 1.0}, "beta_2 must be < 1"),
        ("fedadam", {"tau": float("nan")}, "tau must be a finite number"),
        ("fedadam", {"beta_1": True}, "beta_1 must be a finite number"),
    ],
)
def test_bad_hyperparameters_are_refused(name: str, hyperparameters: dict, message: str) -> None:
    with pytest.raises(InvalidHyperparameter, match=message):
        make_merge(name, **hyperparameters)
