"""The privacy accountant of user-level differential privacy: Google's ``dp-accounting`` (RDP), never our own sums.

What the accountant is told, and why that is what the relay does (docs/sessions/privacy.md):

- **No amplification by sampling.** DP-FedAvg's published guarantees (McMahan et al. 2018, "Learning
  Differentially Private Recurrent Language Models", ICLR) assume each user takes part in a round with a fixed
  probability q. A volunteer takes part when they show up, which is not a coin the relay tosses, so the accountant
  is given q = 1: every round is a full Gaussian mechanism. (What is lost: sampling would make each round far
  cheaper when the population is large; claiming it here would be false.)
- **Zero-out adjacency** (Kairouz et al. 2021, "Practical and Private (Deep) Learning without Sampling or
  Shuffling", the setting of Gboard's DP training): two runs differ in one privacy unit's data being replaced by
  nothing, its update by zero; who takes part in a round (the count the average divides by) is the same in both.
  Each round adds ``N(0, (z C)^2)`` to the sum of updates clipped to C, a Gaussian mechanism of noise multiplier z.
- **One clipped update per privacy unit per round** (``server.session.privacy`` groups a round's results by their
  privacy unit before clipping), so a unit that took part in n rounds has had n Gaussian mechanisms run on its data,
  whatever the other rounds did; the session's epsilon is that of its most-used unit. A privacy unit is a unit of
  the host's data (each once per pass) or, for a task that trains on volunteers' own files, a volunteer's peer.

The same Gaussian mechanism composed n times is what ``epsilon`` hands to ``RdpAccountant`` (Mironov 2017, with the
RDP-to-(epsilon, delta) conversion of Canonne, Kamath and Steinke 2020 that dp-accounting uses).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

# (dp_accounting is imported where it is used: it brings scipy, and a settings check or `--help` needs neither.)


def gaussian_rounds(noise_multiplier: float, rounds: int) -> Any:
    """The DpEvent of ``rounds`` Gaussian mechanisms of noise multiplier ``noise_multiplier`` (sensitivity 1, q = 1)."""
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)


@lru_cache(maxsize=4096)
def epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds of a privacy unit's data through a Gaussian mechanism of noise
    multiplier ``noise_multiplier``; 0 for no rounds (nothing of the unit was used)."""
    if rounds < 0 or not noise_multiplier > 0 or not 0 < delta < 1:
        raise ValueError(f"epsilon needs rounds >= 0, noise multiplier > 0 and 0 < delta < 1; got {rounds}, "
                         f"{noise_multiplier}, {delta}")
    if rounds == 0:
        return 0.0
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(gaussian_rounds(noise_multiplier, rounds))
    return float(accountant.get_epsilon(delta))


def noise_for_epsilon(target_epsilon: float, rounds: int, delta: float) -> float:
    """The smallest noise multiplier whose ``epsilon(z, rounds, delta)`` is at most ``target_epsilon``
    (dp-accounting's calibration: Brent's method over fresh accountants)."""
    if not target_epsilon > 0 or rounds < 1:
        raise ValueError(f"calibration needs a target epsilon > 0 and rounds >= 1; got {target_epsilon}, {rounds}")
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    found = dp_accounting.calibrate_dp_mechanism(
        rdp_privacy_accountant.RdpAccountant, lambda z: gaussian_rounds(z, rounds), target_epsilon, delta,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4)
    return float(found)


def describe(value: float) -> str:
    """Epsilon in words a volunteer can weigh (the scale Gboard's and Apple's deployments are read on)."""
    if not math.isfinite(value):
        return "no guarantee"
    if value <= 1:
        return "strong: what the model learns from your data is hard to tell from it learning nothing of it"
    if value <= 3:
        return "good: within what deployed products (Gboard: about 1 to 14) call strong"
    if value <= 10:
        return "moderate: a guarantee, weaker than strong; common for deployed models"
    return "weak: a formal bound, but too loose to promise much"
