"""CartPole-v1, step for step the same numbers as Gymnasium 1.x's ``gym.make("CartPole-v1")``.

The physics is Gymnasium's ``CartPoleEnv`` (Barto, Sutton & Anderson 1983; Euler integration, tau 0.02 s):
the state lives in float64, observations are the float32 cast of it, the reward is 1.0 on every step
including the terminating one, and the ``TimeLimit`` wrapper truncates at 500 steps
(``truncated = elapsed >= 500``, even on the step that also terminates).

Seeding is reproduced exactly: Gymnasium's ``reset(seed=s)`` calls ``gymnasium.utils.seeding.np_random(s)``,
which builds ``np.random.Generator(np.random.PCG64(np.random.SeedSequence(s)))``, and draws the initial
state with ``uniform(low=-0.05, high=0.05, size=(4,))``. ``reset(seed=None)`` keeps drawing from the
previous generator, as Gymnasium does.

``CartPoleBatch`` runs many episodes in parallel in numpy with the same arithmetic, element by element,
as the scalar ``CartPole``; ``play_episodes`` plays seeded episodes with a stochastic policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
HALF_POLE_LENGTH = 0.5  # Gymnasium's `length` is half the pole's length
POLE_MASS_LENGTH = MASS_POLE * HALF_POLE_LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds between state updates
THETA_THRESHOLD_RADIANS = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
MAX_EPISODE_STEPS = 500
RESET_LOW, RESET_HIGH = -0.05, 0.05
NUM_ACTIONS = 2
OBSERVATION_SIZE = 4


class CartPoleError(ValueError):
    """A CartPole call got something it cannot use (no reset yet, a bad action or seed, a bad policy output)."""


def seeded_generator(seed: int | None) -> np.random.Generator:
    """The generator Gymnasium's ``seeding.np_random(seed)`` returns, built the same way."""
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise CartPoleError(f"seed must be a non-negative Python int or None, got {seed!r}")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))


Num = np.ndarray | np.float64  # one episode's float64 scalars or a batch's (N,) arrays


def _dynamics(x: Num, x_dot: Num, theta: Num, theta_dot: Num, force: Num) -> tuple[Num, Num, Num, Num]:
    """One Euler step; the operation order is Gymnasium's, so the rounding is too (scalars or arrays)."""
    costheta = np.cos(theta)
    sintheta = np.sin(theta)
    temp = (force + POLE_MASS_LENGTH * np.square(theta_dot) * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        HALF_POLE_LENGTH * (4.0 / 3.0 - MASS_POLE * np.square(costheta) / TOTAL_MASS)
    )
    xacc = temp - POLE_MASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    return x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc


def _check_action(action: object) -> int:
    if isinstance(action, bool) or not isinstance(action, int | np.integer) or int(action) not in (0, 1):
        raise CartPoleError(f"action must be 0 (push left) or 1 (push right), got {action!r}")
    return int(action)


class CartPole:
    """One CartPole-v1 episode at a time: ``reset(seed) -> obs``, ``step(action) -> (obs, reward, term, trunc)``."""

    def __init__(self, max_episode_steps: int = MAX_EPISODE_STEPS) -> None:
        self.max_episode_steps = max_episode_steps
        self.state: np.ndarray | None = None  # (4,) float64: x, x_dot, theta, theta_dot
        self.elapsed_steps = 0
        self._rng: np.random.Generator | None = None

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None or self._rng is None:
            self._rng = seeded_generator(seed)
        self.state = self._rng.uniform(low=RESET_LOW, high=RESET_HIGH, size=(OBSERVATION_SIZE,))
        self.elapsed_steps = 0
        return np.array(self.state, dtype=np.float32)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool]:
        if self.state is None:
            raise CartPoleError("call reset() before step()")
        force = FORCE_MAG if _check_action(action) == 1 else -FORCE_MAG
        x, x_dot, theta, theta_dot = self.state
        new = _dynamics(x, x_dot, theta, theta_dot, np.float64(force))
        self.state = np.array(new, dtype=np.float64)
        x, theta = self.state[0], self.state[2]
        terminated = bool(
            x < -X_THRESHOLD or x > X_THRESHOLD or theta < -THETA_THRESHOLD_RADIANS or theta > THETA_THRESHOLD_RADIANS
        )
        self.elapsed_steps += 1
        truncated = self.elapsed_steps >= self.max_episode_steps
        return np.array(self.state, dtype=np.float32), 1.0, terminated, truncated


class CartPoleBatch:
    """``n`` independent CartPole-v1 episodes stepped together; each one matches ``CartPole`` bit for bit."""

    def __init__(self, n: int, max_episode_steps: int = MAX_EPISODE_STEPS) -> None:
        if n < 1:
            raise CartPoleError(f"a batch needs at least one episode, got n={n}")
        self.n = n
        self.max_episode_steps = max_episode_steps
        self.state = np.zeros((n, OBSERVATION_SIZE), dtype=np.float64)  # (N, 4)
        self.elapsed_steps = np.zeros(n, dtype=np.int64)
        self._was_reset = False

    def reset(self, seeds: list[int] | np.ndarray) -> np.ndarray:
        """Start every episode from Gymnasium's initial state for its seed; returns (N, 4) float32."""
        seeds = [int(s) for s in seeds]
        if len(seeds) != self.n:
            raise CartPoleError(f"reset needs {self.n} seeds, got {len(seeds)}")
        for i, seed in enumerate(seeds):
            self.state[i] = seeded_generator(seed).uniform(low=RESET_LOW, high=RESET_HIGH, size=(OBSERVATION_SIZE,))
        self.elapsed_steps[:] = 0
        self._was_reset = True
        return self.state.astype(np.float32)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every episode; returns obs (N, 4) float32, rewards (N,) float64, terminated (N,), truncated (N,)."""
        if not self._was_reset:
            raise CartPoleError("call reset() before step()")
        actions = np.asarray(actions)
        if actions.shape != (self.n,) or not np.isin(actions, (0, 1)).all():
            raise CartPoleError(f"actions must be {self.n} values in {{0, 1}}, got shape {actions.shape}")
        force = np.where(actions == 1, FORCE_MAG, -FORCE_MAG)
        new = _dynamics(self.state[:, 0], self.state[:, 1], self.state[:, 2], self.state[:, 3], force)
        self.state = np.stack(new, axis=1)
        x, theta = self.state[:, 0], self.state[:, 2]
        terminated = (x < -X_THRESHOLD) | (x > X_THRESHOLD) | (theta < -THETA_THRESHOLD_RADIANS)
        terminated |= theta > THETA_THRESHOLD_RADIANS
        self.elapsed_steps += 1
        truncated = self.elapsed_steps >= self.max_episode_steps
        return self.state.astype(np.float32), np.ones(self.n, dtype=np.float64), terminated, truncated


@dataclass
class Trajectory:
    """One played episode. ``observations[t]`` is what the policy saw before choosing ``actions[t]``."""

    reset_seed: int
    observations: np.ndarray  # (T, 4) float32
    actions: np.ndarray  # (T,) int64
    action_probs: np.ndarray  # (T,) float64, the probability the policy gave the chosen action
    rewards: np.ndarray  # (T,) float64
    terminated: bool
    truncated: bool

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])

    @property
    def total_reward(self) -> float:
        return float(self.rewards.sum())


def episode_seeds(seed: int, index: int) -> tuple[int, np.random.Generator]:
    """Episode ``index`` of a run seeded ``seed``: its reset seed and its own action-sampling generator.

    Both come from ``SeedSequence(seed, spawn_key=(index, k))``, so an episode does not depend on how many
    others are played beside it, and a retried assignment replays exactly.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise CartPoleError(f"seed must be a non-negative int, got {seed!r}")
    reset_seed = int(np.random.SeedSequence(int(seed), spawn_key=(index, 0)).generate_state(1)[0])
    action_rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=(index, 1))))
    return reset_seed, action_rng


PolicyFn = Callable[[np.ndarray], np.ndarray]


def _right_probabilities(policy_fn: PolicyFn, obs: np.ndarray) -> np.ndarray:
    """Call the policy on (M, 4) observations; accept (M, 2) action probabilities or (M,) P(push right)."""
    probs = np.asarray(policy_fn(obs), dtype=np.float64)
    m = obs.shape[0]
    if probs.shape == (m, NUM_ACTIONS):
        total = probs.sum(axis=1)
        if not np.all(np.isfinite(probs)) or np.any(probs < 0) or np.any(total <= 0):
            raise CartPoleError(f"policy returned invalid probabilities: {probs[:3]}")
        return probs[:, 1] / total
    if probs.shape == (m,):
        if not np.all(np.isfinite(probs)) or np.any(probs < 0) or np.any(probs > 1):
            raise CartPoleError(f"policy returned invalid P(right): {probs[:3]}")
        return probs
    raise CartPoleError(f"policy must return shape ({m}, 2) or ({m},) for {m} observations, got {probs.shape}")


def play_episodes(
    policy_fn: PolicyFn, n_episodes: int, seed: int, *, max_episode_steps: int = MAX_EPISODE_STEPS
) -> list[Trajectory]:
    """Play ``n_episodes`` CartPole-v1 episodes in parallel, sampling actions from ``policy_fn``.

    ``policy_fn(obs)`` gets (M, 4) float32 observations of the episodes still running and returns action
    probabilities, (M, 2) or (M,) = P(push right). Episode i resets with ``episode_seeds(seed, i)[0]`` and
    draws one uniform per step from its own generator: action 1 when ``u < P(right)``.
    """
    if n_episodes < 1:
        raise CartPoleError(f"n_episodes must be at least 1, got {n_episodes}")
    pairs = [episode_seeds(seed, i) for i in range(n_episodes)]
    env = CartPoleBatch(n_episodes, max_episode_steps)
    obs = env.reset([reset_seed for reset_seed, _ in pairs])
    live = np.ones(n_episodes, dtype=bool)
    record: list[list[tuple[np.ndarray, int, float]]] = [[] for _ in range(n_episodes)]
    ended = [(False, False)] * n_episodes
    while live.any():
        idx = np.flatnonzero(live)
        p_right = _right_probabilities(policy_fn, obs[idx])
        actions = np.zeros(n_episodes, dtype=np.int64)
        for j, i in enumerate(idx.tolist()):
            actions[i] = 1 if pairs[i][1].random() < p_right[j] else 0
            chosen_prob = p_right[j] if actions[i] == 1 else 1.0 - p_right[j]
            record[i].append((obs[i], int(actions[i]), float(chosen_prob)))
        obs, _, terminated, truncated = env.step(actions)
        for i in idx.tolist():
            if terminated[i] or truncated[i]:
                live[i] = False
                ended[i] = (bool(terminated[i]), bool(truncated[i]))
    trajectories = []
    for i, steps in enumerate(record):
        trajectories.append(
            Trajectory(
                reset_seed=pairs[i][0],
                observations=np.stack([s[0] for s in steps]).astype(np.float32),
                actions=np.array([s[1] for s in steps], dtype=np.int64),
                action_probs=np.array([s[2] for s in steps], dtype=np.float64),
                rewards=np.ones(len(steps), dtype=np.float64),
                terminated=ended[i][0],
                truncated=ended[i][1],
            )
        )
    return trajectories
