"""The privacy accountant: dp-accounting's own numbers, the exact Gaussian mechanism, and a published figure."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.stats import norm

from server.session import accountant


@pytest.mark.parametrize(("z", "rounds", "delta"), [(1.0, 1, 1e-6), (1.1, 12, 1e-5), (0.8, 50, 1e-10), (5.0, 3, 1e-6)])
def test_epsilon_is_dp_accountings_own(z: float, rounds: int, delta: float) -> None:
    """The same figure as dp-accounting's RDP accountant handed one Gaussian event per round, one at a time."""
    by_hand = rdp_privacy_accountant.RdpAccountant()
    for _ in range(rounds):
        by_hand.compose(dp_accounting.GaussianDpEvent(z))
    assert accountant.epsilon(z, rounds, delta) == pytest.approx(by_hand.get_epsilon(delta), rel=1e-12)


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon of a mu-GDP mechanism at delta (Balle and Wang 2018, Theorem 8; Dong, Roth and Su 2022,
    Corollary 2.13): delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), solved by bisection."""
    def delta_of(eps: float) -> float:
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))

    low, high = 0.0, 200.0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high


@pytest.mark.parametrize(("z", "rounds"), [(1.0, 4), (2.0, 30), (0.7, 1)])
def test_epsilon_bounds_the_exact_gaussian_one_and_pld_agrees_with_it(z: float, rounds: int) -> None:
    """n rounds of a Gaussian mechanism of multiplier z are exactly one of multiplier z / sqrt(n) (mu = sqrt(n)/z);
    RDP's epsilon is an upper bound of its exact epsilon, dp-accounting's PLD accountant finds it."""
    delta = 1e-6
    exact = exact_gaussian_epsilon(math.sqrt(rounds) / z, delta)
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(accountant.gaussian_rounds(z, rounds))
    assert pld.get_epsilon(delta) == pytest.approx(exact, rel=0.01)
    ours = accountant.epsilon(z, rounds, delta)
    assert exact <= ours <= 1.25 * exact


def test_the_published_dp_sgd_figure() -> None:
    """Abadi et al. 2016 ("Deep Learning with Differential Privacy", CCS, section 3.1): q = 0.01, sigma = 4,
    delta = 1e-5, T = 10,000 steps give epsilon ~ 1.26 with the moments accountant (orders lambda <= 32, epsilon =
    min over lambda of (alpha(lambda) + log(1/delta)) / lambda). dp-accounting's RDP of the same sampled Gaussian
    over those orders, converted the same way, gives that figure; its default orders and tighter conversion (what
    ``accountant.epsilon`` uses) give less, never more."""
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(4.0)), 10_000)
    orders = np.arange(2, 33)
    moments = rdp_privacy_accountant.RdpAccountant(list(orders))
    moments.compose(event)
    published = float(np.min(np.asarray(moments.rdp) + math.log(1 / 1e-5) / (orders - 1)))
    assert round(published, 2) == 1.26
    tight = rdp_privacy_accountant.RdpAccountant()
    tight.compose(event)
    assert tight.get_epsilon(1e-5) < published


def test_calibration_finds_the_noise_for_an_epsilon() -> None:
    z = accountant.noise_for_epsilon(3.0, 12, 1e-6)
    assert accountant.epsilon(z, 12, 1e-6) == pytest.approx(3.0, abs=0.01)
    assert accountant.epsilon(z * 1.05, 12, 1e-6) < 3.0 < accountant.epsilon(z * 0.95, 12, 1e-6)


def test_epsilon_grows_with_rounds_and_falls_with_noise() -> None:
    values = [accountant.epsilon(1.0, n, 1e-6) for n in range(0, 6)]
    assert values[0] == 0.0 and all(a < b for a, b in zip(values, values[1:], strict=False))
    assert accountant.epsilon(2.0, 5, 1e-6) < accountant.epsilon(1.0, 5, 1e-6)


@pytest.mark.parametrize(("z", "rounds", "delta"), [(0.0, 1, 1e-6), (1.0, -1, 1e-6), (1.0, 1, 0.0), (1.0, 1, 1.0),
                                                    (float("nan"), 1, 1e-6)])
def test_bad_arguments_are_refused(z: float, rounds: int, delta: float) -> None:
    with pytest.raises(ValueError, match="epsilon needs"):
        accountant.epsilon(z, rounds, delta)
