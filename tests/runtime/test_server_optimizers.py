"""The server optimizers Reddi et al. add to FedAdam (FedYogi, FedAdagrad), FedAvg's server learning rate and the
history's diagnostics, against numbers computed by hand (the comments show the arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.merge import MERGES, FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi, Result, StateMismatch, make_merge
from runtime.weights import WeightSpec


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def one(*values: float) -> list[Result]:
    return [Result(f32(*values), 10)]


# ---------------------------------------------------------------- FedAvg's server learning rate


def test_fedavg_server_learning_rate_three_rounds() -> None:
    merge = FedAvg(server_learning_rate=2.0)
    # round 1: average (2, 0) from global (1, 1): change (1, -1); new = (1, 1) + 2 * (1, -1) = (3, -1)
    g = merge.merge(f32(1, 1), one(2, 0))
    np.testing.assert_array_equal(g, f32(3, -1))
    # round 2: average (1*4 + 3*6) / 4 = 5.5, (1*-1 + 3*3) / 4 = 2; change (2.5, 3); new = (3 + 5, -1 + 6) = (8, 5)
    g = merge.merge(g, [Result(f32(4, -1), 1), Result(f32(6, 3), 3)])
    np.testing.assert_array_equal(g, f32(8, 5))
    # round 3: average (7, 5): change (-1, 0); new = (8 - 2, 5) = (6, 5)
    g = merge.merge(g, one(7, 5))
    np.testing.assert_array_equal(g, f32(6, 5))
    assert merge.state_dict() == {}  # still stateless: a step size, no memory
    # lr 0.5 damps: global (0, 4), average (2, 0): new = (0 + 1, 4 - 2) = (1, 2)
    np.testing.assert_array_equal(FedAvg(server_learning_rate=0.5).merge(f32(0, 4), one(2, 0)), f32(1, 2))


def test_fedavg_at_learning_rate_one_is_the_average_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    g = rng.normal(size=64).astype(np.float32)
    results = [Result(rng.normal(size=64).astype(np.float32), int(rng.integers(1, 9))) for _ in range(4)]
    plain = FedAvg().merge(g, results)
    assert FedAvg(server_learning_rate=1.0).merge(g, results).tobytes() == plain.tobytes()
    # the same step as FedAvgM without momentum
    np.testing.assert_allclose(FedAvg(server_learning_rate=1.7).merge(g, results),
                               FedAvgM(server_learning_rate=1.7, server_momentum=0.0).merge(g, results), rtol=1e-6)


# ---------------------------------------------------------------- FedYogi
# eta 0.5, beta_1 0.5, beta_2 0.75 (so 1 - beta_2 = 0.25), tau 1, no bias correction.
# v = v - 0.25 * delta**2 * sign(v - delta**2). Coordinate 0: delta = 2, 1, -1. Coordinate 1: delta = 0, 4, -1.


def test_fedyogi_three_rounds_without_bias_correction() -> None:
    merge = FedYogi(eta=0.5, beta_1=0.5, beta_2=0.75, tau=1.0, bias_correction=False)
    g = f32(1, -1)
    # round 1: delta (2, 0): m = (1, 0); v = 0 - 0.25*(4, 0)*sign(0 - (4, 0)) = (1, 0) (as Adam's, from v = 0)
    #          step = 0.5 * (1, 0) / ((1, 0) + 1) = (0.25, 0); g = (1.25, -1)
    g = merge.merge(g, one(3, -1))
    np.testing.assert_array_equal(g, f32(1.25, -1))
    np.testing.assert_array_equal(merge.state_dict()["v"], [1, 0])
    # round 2: delta (1, 4): m = 0.5*(1, 0) + 0.5*(1, 4) = (1, 2)
    #          v0 = 1 - 0.25*1*sign(1 - 1) = 1; v1 = 0 - 0.25*16*sign(0 - 16) = 4
    #          step = 0.5 * (1/(1+1), 2/(2+1)) = (0.25, 1/3); g = (1.5, -2/3)
    g = merge.merge(g, one(2.25, 3))
    np.testing.assert_allclose(g, f32(1.5, -2 / 3), rtol=1e-7)
    # round 3: delta (-1, -1): m = 0.5*(1, 2) + 0.5*(-1, -1) = (0, 0.5)
    #          v0 = 1 - 0.25*1*sign(0) = 1; v1 = 4 - 0.25*1*sign(4 - 1) = 3.75 (Adam: 0.75*4 + 0.25*1 = 3.25)
    #          step = (0, 0.5 * 0.5 / (sqrt(3.75) + 1)) = (0, 0.25 / 2.9364917) = (0, 0.0851353)
    g = merge.merge(g, one(0.5, -2 / 3 - 1))
    np.testing.assert_allclose(g, f32(1.5, -2 / 3 + 0.25 / (3.75**0.5 + 1)), rtol=1e-6)
    state = merge.state_dict()
    assert state["t"] == 3
    np.testing.assert_allclose(state["m"], [0, 0.5], atol=1e-7)
    np.testing.assert_allclose(state["v"], [1, 3.75], rtol=1e-6)


def test_fedyogi_with_bias_correction_matches_fedadam_while_delta_squared_grows() -> None:
    # While delta**2 > v every round, sign(v - delta**2) = -1 and Yogi's v = v + 0.25*delta**2, whereas Adam's
    # v = 0.75*v + 0.25*delta**2. Deltas 2, 4: Yogi v = 1, 1 + 4 = 5; Adam v = 1, 0.75 + 4 = 4.75.
    # With bias correction (1 - 0.75**t = 0.25, 0.4375): Yogi v_hat = 4, 5/0.4375 = 11.428571
    # m = 1, 0.5 + 2 = 2.5; m_hat = 1/0.5 = 2, 2.5/0.75 = 10/3. tau 0.5, eta 0.5.
    # step 1 = 0.5*2/(2 + 0.5) = 0.4 (the same for both); step 2 = 0.5*(10/3)/(sqrt(11.428571) + 0.5)
    yogi = FedYogi(eta=0.5, beta_1=0.5, beta_2=0.75, tau=0.5)
    adam = FedAdam(eta=0.5, beta_1=0.5, beta_2=0.75, tau=0.5)
    g_yogi = yogi.merge(f32(0), one(2))
    assert g_yogi.tobytes() == adam.merge(f32(0), one(2)).tobytes()
    np.testing.assert_allclose(g_yogi, f32(0.4), rtol=1e-7)
    g_yogi = yogi.merge(g_yogi, one(0.4 + 4))
    np.testing.assert_allclose(g_yogi, f32(0.4 + 0.5 * (10 / 3) / ((5 / 0.4375) ** 0.5 + 0.5)), rtol=1e-6)
    np.testing.assert_allclose(yogi.state_dict()["v"], [5.0], rtol=1e-6)


# ---------------------------------------------------------------- FedAdagrad
# eta 0.5, beta_1 0.5, tau 1; v = v + delta**2. Coordinate 0: delta = 3, 4, 0 (v = 9, 25, 25: sqrt 3, 5, 5).
# Coordinate 1: delta = 0, 0, 2 (v = 0, 0, 4). m = 0.5*m + 0.5*delta: (1.5, 0), (2.75, 0), (1.375, 1).


@pytest.mark.parametrize("bias_correction", [False, True])
def test_fedadagrad_three_rounds(bias_correction: bool) -> None:
    merge = FedAdagrad(eta=0.5, beta_1=0.5, beta_2=0.75, tau=1.0, bias_correction=bias_correction)
    # without correction: step0 = 0.5*1.5/(3+1) = 0.1875, 0.5*2.75/(5+1) = 0.2291667, 0.5*1.375/6 = 0.1145833
    #                     step1 = 0, 0, 0.5*1/(2+1) = 1/6
    # with correction (m only; 1 - 0.5**t = 0.5, 0.75, 0.875): m_hat0 = 3, 3.6666667, 1.5714286; m_hat1 = 0, 0,
    #   1/0.875 = 1.1428571 -> step0 = 0.375, 0.3055556, 0.1309524; step1 = 0, 0, 0.5*1.1428571/3 = 0.1904762
    steps = ([(0.375, 0.0), (0.5 * (2.75 / 0.75) / 6, 0.0), (0.5 * (1.375 / 0.875) / 6, 0.5 * (1 / 0.875) / 3)]
             if bias_correction else [(0.1875, 0.0), (0.5 * 2.75 / 6, 0.0), (0.5 * 1.375 / 6, 1 / 6)])
    g = np.array([1.0, -1.0])
    for (d0, d1), (s0, s1) in zip([(3, 0), (4, 0), (0, 2)], steps, strict=True):
        merged = merge.merge(g.astype(np.float32), [Result((g + [d0, d1]).astype(np.float32), 1)])
        g = g + [s0, s1]
        np.testing.assert_allclose(merged, g.astype(np.float32), rtol=1e-6)
        g = merged.astype(np.float64)
    state = merge.state_dict()
    assert state["t"] == 3
    np.testing.assert_allclose(state["v"], [25, 4], rtol=1e-6)  # a plain sum: never corrected, never decayed
    np.testing.assert_allclose(state["m"], [1.375, 1], rtol=1e-6)


def test_adaptive_methods_share_state_checks() -> None:
    for merge in (FedYogi(), FedAdagrad()):
        assert merge.state_dict() == {"t": 0}
        with pytest.raises(StateMismatch, match=f"{merge.name} state 'v' holds negative values"):
            merge.load_state_dict({"t": 1, "m": np.zeros(2), "v": -np.ones(2)})


# ---------------------------------------------------------------- diagnostics


def test_round_diagnostics_by_hand() -> None:
    from runtime.merge.diagnostics import round_diagnostics

    spec = WeightSpec((("a", (2,)), ("b", (2,))))
    delta = np.array([3.0, 4.0, 0.0, 0.0])  # norm 5; rms a = sqrt((9 + 16) / 2) = sqrt(12.5), rms b = 0
    previous = np.array([0.0, 1.0, 0.0, 0.0])  # cosine = 4 / (5 * 1) = 0.8
    out = round_diagnostics(delta, previous, step=2 * delta, spec=spec)
    assert out["pseudo_gradient_norm"] == 5.0 and out["step_norm"] == 10.0
    assert out["cosine_previous"] == pytest.approx(0.8)
    assert out["tensor_rms"] == {"min": 0.0, "median": pytest.approx(12.5**0.5 / 2), "max": pytest.approx(12.5**0.5),
                                 "largest": "a"}
    assert out["spread"] == pytest.approx(1.0)  # rms (r, 0): mean r/2, std r/2
    assert round_diagnostics(delta, None, delta)["cosine_previous"] is None
    assert round_diagnostics(delta, np.zeros(4), delta)["cosine_previous"] is None  # a zero vector has no angle


@pytest.mark.parametrize("name", sorted(MERGES))
def test_each_merge_keeps_its_round_delta(name: str) -> None:
    merge = make_merge(name)
    merge.merge(f32(1, 1), [Result(f32(2, 0), 1), Result(f32(4, 0), 3)])  # average (3.5, 0): delta (2.5, -1)
    assert merge.last_delta is not None
    np.testing.assert_array_equal(merge.last_delta, [2.5, -1.0])
