"""The maths of user-level differential privacy as plain functions (numpy only): the host's DP-FedAvg stage
(``server.session.privacy``) and a page's local noise both use them; the accounting is the host's
(``server.session.accountant``, Google's dp-accounting).

- DP-FedAvg (McMahan, Ramage, Talwar and Zhang 2018, "Learning Differentially Private Recurrent Language Models"):
  each update clipped to L2 norm C, the clipped updates averaged over the m that took part, Gaussian noise of
  standard deviation z C / m added to the average.
- Adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy 2021, "Differentially Private Learning with Adaptive
  Clipping", NeurIPS): C follows the gamma quantile of the update norms, C <- C exp(-eta (b - gamma)) with b the
  share of updates at most C, counted with noise; the round's noise multiplier z is split between the count and the
  update so the two together are one Gaussian mechanism of multiplier z (their Theorem 1).
"""

from __future__ import annotations

import math

import numpy as np

# Andrew et al.'s geometric step for the clip (eta_C in their Algorithm 1 and experiments).
CLIP_LEARNING_RATE = 0.2
# The share of a round's privacy budget (in 1/z^2) the unclipped count spends, as TensorFlow Federated's
# ``clipped_count_budget_allocation`` (default 0.1): the update's multiplier grows by 1/sqrt(0.9), 5 %.
COUNT_BUDGET_SHARE = 0.1


# How far one privacy unit can move an aggregator's output once every update is clipped to C, with m updates, as
# (factor of C, divided by m): the mean by C / m; Krum and MultiKrum pick (and average) clipped updates, so one
# changed update can move the pick anywhere in the ball of radius C: 2 C. Coordinate-wise aggregators (median,
# trimmed mean) can leave that ball (three updates of norm 1 can have a coordinate-wise median of norm 1.22) and
# centered clipping steps from a centre outside it: no bound here holds for them, so DP refuses them.
SENSITIVITY: dict[str, tuple[float, bool]] = {"mean": (1.0, True), "krum": (2.0, False), "multikrum": (2.0, False)}


def sensitivity(aggregator: str, clip: float, m: int) -> float:
    """How far one privacy unit's update (of m, each clipped to ``clip``) can move ``aggregator``'s output."""
    factor, per_update = SENSITIVITY[aggregator]
    return clip * factor / (m if per_update else 1)


def clip_to_norm(update: np.ndarray, clip: float) -> tuple[np.ndarray, float]:
    """(``update`` scaled to L2 norm at most ``clip``, its norm before) in float64: ``update * min(1, C / |u|)``."""
    update = np.asarray(update, dtype=np.float64)
    norm = float(np.linalg.norm(update))
    if norm <= clip:
        return update.copy(), norm
    return update * (clip / norm), norm


def gaussian_noise(rng: np.random.Generator, size: int, std: float) -> np.ndarray:
    """``size`` draws of N(0, std^2) in float64 from ``rng`` (a seeded generator repeats them exactly)."""
    if std < 0 or not math.isfinite(std):
        raise ValueError(f"a noise standard deviation is a finite number >= 0, got {std}")
    return rng.normal(0.0, std, size) if std > 0 else np.zeros(size, dtype=np.float64)


def split_noise(noise_multiplier: float, adaptive: bool) -> tuple[float, float]:
    """(the update's noise multiplier, the unclipped count's noise standard deviation) for a round of multiplier
    z: (z, 0) with a fixed clip; with adaptive clipping z_u = z / sqrt(1 - a) and sigma_b = z / (2 sqrt(a)) for the
    count's share a, so that z_u^-2 + (2 sigma_b)^-2 = z^-2 (Andrew et al. 2021, Theorem 1: a count of bits
    centred on 1/2 has sensitivity 1/2)."""
    if not adaptive:
        return noise_multiplier, 0.0
    share = COUNT_BUDGET_SHARE
    return noise_multiplier / math.sqrt(1 - share), noise_multiplier / (2 * math.sqrt(share))


def next_clip(clip: float, unclipped_share: float, target_quantile: float,
              learning_rate: float = CLIP_LEARNING_RATE) -> float:
    """The geometric update of adaptive clipping: ``C exp(-eta (b - gamma))``; b above gamma (too few updates are
    clipped) shrinks C, below grows it."""
    return float(clip * math.exp(-learning_rate * (unclipped_share - target_quantile)))


def local_noise_std(noise_multiplier: float, clip: float) -> float:
    """A page's own noise on its clipped update (local DP: the update alone is a Gaussian mechanism of
    sensitivity C, whoever sees it)."""
    return noise_multiplier * clip


def noise_bound(noise_multiplier: float, clip: float, size: int) -> float:
    """A norm an honestly noised update stays under but with probability below e^-50: C + z C (sqrt(d) + 10)
    (the norm of d Gaussians of deviation s exceeds s (sqrt(d) + t) with probability at most e^(-t^2 / 2))."""
    return clip + local_noise_std(noise_multiplier, clip) * (math.sqrt(size) + 10)


def privatize_update(base: np.ndarray, trained: np.ndarray, noise_multiplier: float, clip: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Local DP on a peer: the weights ``base + clip(trained - base) + N(0, (z C)^2)`` as float32. ``rng`` must be
    secret (the peer seeds it from the system's randomness): noise that anyone can reproduce protects nothing."""
    clipped, _ = clip_to_norm(np.asarray(trained, np.float64) - base, clip)
    noise = gaussian_noise(rng, clipped.shape[0], local_noise_std(noise_multiplier, clip))
    return (np.asarray(base, np.float64) + clipped + noise).astype(np.float32)
