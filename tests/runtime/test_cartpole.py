"""CartPole-v1 against Gymnasium's own, step for step and bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.envs import CartPole, CartPoleBatch, CartPoleError, episode_seeds, play_episodes

gym = pytest.importorskip("gymnasium")

N_SEEDS = 200
GAINS = (0.1, 0.5, 10.0, 2.0)  # a linear balancing controller that survives 500 steps from every start tried


def balancing_action(obs: np.ndarray) -> int:
    return int(sum(g * float(o) for g, o in zip(GAINS, obs, strict=True)) > 0)


def action_for(seed: int, obs: np.ndarray, rng: np.random.Generator) -> int:
    """Even seeds balance (and reach truncation), odd seeds act at random, every fifth mixes both."""
    if seed % 5 == 0:
        return balancing_action(obs) if rng.random() < 0.9 else int(rng.integers(2))
    return balancing_action(obs) if seed % 2 == 0 else int(rng.integers(2))


def test_matches_gymnasium_step_for_step() -> None:
    reference = gym.make("CartPole-v1")
    ours = CartPole()
    lengths, truncations = [], 0
    for seed in range(N_SEEDS):
        ref_obs, _ = reference.reset(seed=seed)
        obs = ours.reset(seed)
        assert obs.dtype == np.float32 and obs.shape == (4,)
        assert obs.tobytes() == ref_obs.tobytes()
        rng = np.random.default_rng(10_000 + seed)
        for step in range(600):
            action = action_for(seed, obs, rng)
            ref_obs, ref_reward, ref_term, ref_trunc, _ = reference.step(action)
            obs, reward, term, trunc = ours.step(action)
            assert obs.tobytes() == ref_obs.tobytes(), (seed, step)
            assert (reward, term, trunc) == (ref_reward, ref_term, ref_trunc), (seed, step)
            if term or trunc:
                lengths.append(step + 1)
                truncations += trunc
                break
    assert truncations >= N_SEEDS // 3  # the balancing episodes really reach the time limit
    assert max(lengths) == 500 and min(lengths) < 30


def test_reset_without_seed_continues_the_generator_like_gymnasium() -> None:
    reference = gym.make("CartPole-v1")
    ours = CartPole()
    assert reference.reset(seed=7)[0].tobytes() == ours.reset(7).tobytes()
    for _ in range(3):
        assert reference.reset()[0].tobytes() == ours.reset().tobytes()


def test_batch_matches_scalar_bit_for_bit() -> None:
    seeds = list(range(300, 364))
    batch = CartPoleBatch(len(seeds))
    batch_obs = batch.reset(seeds)
    singles = [CartPole() for _ in seeds]
    for env, seed, row in zip(singles, seeds, batch_obs, strict=True):
        assert env.reset(seed).tobytes() == row.tobytes()
    done = np.zeros(len(seeds), dtype=bool)
    rng = np.random.default_rng(3)
    for _ in range(500):
        actions = np.array([balancing_action(o) if i % 2 else int(rng.integers(2)) for i, o in enumerate(batch_obs)])
        batch_obs, rewards, terms, truncs = batch.step(actions)
        for i, env in enumerate(singles):
            if done[i]:
                continue
            obs, reward, term, trunc = env.step(int(actions[i]))
            assert obs.tobytes() == batch_obs[i].tobytes()
            assert (reward, term, trunc) == (rewards[i], terms[i], truncs[i])
            done[i] = term or trunc
    assert done.all()


def uniform_policy(obs: np.ndarray) -> np.ndarray:
    return np.full((obs.shape[0], 2), 0.5)


def leaning_policy(obs: np.ndarray) -> np.ndarray:
    p_right = 1.0 / (1.0 + np.exp(-(10.0 * obs[:, 2] + 2.0 * obs[:, 3])))
    return p_right  # (M,) = P(push right) is accepted too


def test_play_episodes_replays_exactly_and_matches_gymnasium() -> None:
    first = play_episodes(leaning_policy, 12, seed=5)
    again = play_episodes(leaning_policy, 12, seed=5)
    prefix = play_episodes(leaning_policy, 4, seed=5)
    other = play_episodes(leaning_policy, 12, seed=6)
    for a, b in zip(first, again, strict=True):
        assert a.reset_seed == b.reset_seed and a.actions.tolist() == b.actions.tolist()
        assert a.observations.tobytes() == b.observations.tobytes()
    for a, b in zip(first[:4], prefix, strict=True):  # an episode does not depend on its neighbours
        assert a.actions.tolist() == b.actions.tolist()
    assert [t.reset_seed for t in first] != [t.reset_seed for t in other]
    assert len({t.reset_seed for t in first}) == 12
    assert first[3].reset_seed == episode_seeds(5, 3)[0]
    reference = gym.make("CartPole-v1")
    for traj in first:
        obs, _ = reference.reset(seed=traj.reset_seed)
        for t in range(traj.length):
            assert obs.tobytes() == traj.observations[t].tobytes()
            obs, _, term, trunc, _ = reference.step(int(traj.actions[t]))
        assert (term, trunc) == (traj.terminated, traj.truncated)
        assert traj.total_reward == traj.length and (traj.terminated or traj.truncated)
        assert np.all((traj.action_probs > 0) & (traj.action_probs <= 1))


def test_play_episodes_samples_from_the_policy() -> None:
    trajectories = play_episodes(uniform_policy, 40, seed=0)
    actions = np.concatenate([t.actions for t in trajectories])
    assert 0.4 < actions.mean() < 0.6
    assert np.all(np.concatenate([t.action_probs for t in trajectories]) == 0.5)
    always_right = play_episodes(lambda obs: np.ones(obs.shape[0]), 3, seed=0)
    assert all(t.actions.tolist() == [1] * t.length for t in always_right)


def test_errors_are_named() -> None:
    env = CartPole()
    with pytest.raises(CartPoleError, match="reset"):
        env.step(0)
    env.reset(0)
    with pytest.raises(CartPoleError, match="action"):
        env.step(2)
    with pytest.raises(CartPoleError, match="seed"):
        env.reset(-1)
    with pytest.raises(CartPoleError, match="shape"):
        play_episodes(lambda obs: np.ones((obs.shape[0], 3)), 2, seed=0)
    with pytest.raises(CartPoleError, match="seeds"):
        CartPoleBatch(3).reset([1, 2])
