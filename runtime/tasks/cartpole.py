"""CartPole-v1 learnt by policy gradient: an experience task, so no data crosses to the peers.

A unit is an episode budget and a seed. The peer plays ``unit.episodes`` episodes with the current
stochastic policy (the 4-16-2 ``MLPPolicy``; episode i resets and samples its actions from
``runtime.envs.episode_seeds(unit.seed, i)``, so a retried unit replays exactly), turns them into a
batch of (observation, action, advantage, old log-probability) and runs a few clipped policy-gradient
steps on it (PPO's surrogate, Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; with
``update_epochs=1`` it is REINFORCE with a baseline, Williams 1992).

Playing and updating are kept apart: ``play`` runs on the CPU with a numpy forward, ``update_policy``
is one forward, backward and optimizer step through the runtime autograd on a prepared
``PolicyBatch``, which is the part a GPU backend can take over (the "hybrid update").

Advantages. The returns-to-go are discounted by ``gamma``. The default baseline, ``"time"``, subtracts
the mean return-to-go of the episodes of the unit still running at the same time step: episodes are
all truncated at 500 steps, so the return still reachable shrinks with the step, and a time-indexed
baseline removes that without a value network (the task's weights are the policy only). The advantages
are then scaled to unit standard deviation over the unit.

``num_examples`` is the number of environment steps played (the rows of the batch), so FedAvg gives a
participant whose policy balanced longer a larger say. Metric: ``greedy_return``, the mean return of
``eval_episodes`` fixed seeded episodes played with the most probable action.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.autograd import Tensor, functional, no_grad, tensor
from runtime.backend import get_backend
from runtime.device_probe import Probe, Step, copier
from runtime.envs.cartpole import MAX_EPISODE_STEPS, CartPoleBatch, Trajectory, episode_seeds, play_episodes
from runtime.models.mlp import MLPPolicy, preset
from runtime.nn import Linear
from runtime.optim import SGD, Adam, Optimizer, clip_grad_norm
from runtime.tasks.base import HostServices, Sample, Task, TaskData, TaskError, UnitResult, WorkUnit

BASELINES = ("time", "mean", "none")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class CartPoleSettings:
    units: int = 60  # episode budgets per pass: 2 participants per round -> 30 rounds per pass
    episodes_per_unit: int = 32
    model: str = "4-16-2"
    gamma: float = 0.99
    baseline: str = "time"  # "time": mean return-to-go at the same step; "mean": over the unit; "none"
    normalize_advantages: bool = True  # divide the advantages by their standard deviation over the unit
    optimizer: str = "adam"  # a fresh optimizer per unit: peers keep no state between assignments
    lr: float = 0.01
    update_epochs: int = 6  # passes over the unit's batch (1 = REINFORCE); 4-6 tuned best, 8 overshoots
    minibatches: int = 1  # steps per epoch (the batch is split into this many shuffled parts)
    clip_ratio: float = 0.2  # PPO's epsilon; probability ratios outside 1 +- this stop pulling
    entropy_bonus: float = 0.0
    max_grad_norm: float = 0.0  # 0 = no clipping
    eval_episodes: int = 20
    eval_seed: int = 2024
    max_episode_steps: int = MAX_EPISODE_STEPS

    def __post_init__(self) -> None:
        if min(self.units, self.episodes_per_unit, self.update_epochs, self.minibatches, self.eval_episodes) < 1:
            raise ValueError("units, episodes_per_unit, update_epochs, minibatches and eval_episodes must be >= 1")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0.0 < self.gamma <= 1.0 or self.lr <= 0 or self.clip_ratio <= 0 or self.max_grad_norm < 0:
            raise ValueError("need 0 < gamma <= 1, lr > 0, clip_ratio > 0 and max_grad_norm >= 0")


@dataclass
class PolicyBatch:
    """One unit's experience, ready for ``update_policy`` (N = number of steps played)."""

    observations: np.ndarray  # (N, 4) float32
    actions: np.ndarray  # (N,) int64
    advantages: np.ndarray  # (N,) float32
    old_log_probs: np.ndarray  # (N,) float32, log pi_old(action | observation) before any update

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def subset(self, rows: np.ndarray) -> PolicyBatch:
        return PolicyBatch(self.observations[rows], self.actions[rows], self.advantages[rows], self.old_log_probs[rows])


# -- acting (CPU, numpy) --------------------------------------------------------------------------
Layers = list[tuple[np.ndarray, np.ndarray]]  # (weight (out, in), bias (out,)) per Linear


def policy_layers(policy: MLPPolicy) -> Layers:
    layers = []
    for layer in policy.layers:
        assert isinstance(layer, Linear) and layer.bias is not None
        layers.append((layer.weight.numpy().astype(np.float64), layer.bias.numpy().astype(np.float64)))
    return layers


def policy_logits(layers: Layers, observations: np.ndarray) -> np.ndarray:
    """The MLP's forward in numpy float64: (M, 4) -> (M, 2) logits."""
    x = np.asarray(observations, dtype=np.float64)
    for weight, bias in layers[:-1]:
        x = np.tanh(x @ weight.T + bias)  # (M, hidden)
    weight, bias = layers[-1]
    return x @ weight.T + bias


def policy_probabilities(layers: Layers, observations: np.ndarray) -> np.ndarray:
    logits = policy_logits(layers, observations)
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(axis=1, keepdims=True)  # (M, 2)


def greedy_returns(layers: Layers, reset_seeds: Sequence[int], max_steps: int = MAX_EPISODE_STEPS) -> np.ndarray:
    """Play one episode per reset seed, always pushing the most probable way; returns (E,) float64 returns."""
    env = CartPoleBatch(len(reset_seeds), max_steps)
    obs = env.reset(list(reset_seeds))
    live = np.ones(len(reset_seeds), dtype=bool)
    returns = np.zeros(len(reset_seeds))
    while live.any():
        logits = policy_logits(layers, obs)
        actions = (logits[:, 1] > logits[:, 0]).astype(np.int64)
        obs, rewards, terminated, truncated = env.step(actions)
        returns += np.where(live, rewards, 0.0)
        live &= ~(terminated | truncated)
    return returns


# -- turning episodes into a batch ----------------------------------------------------------------
def returns_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma * G_{t+1}, (T,) float64; truncated episodes are not bootstrapped."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def compute_advantages(trajectories: Sequence[Trajectory], gamma: float, baseline: str, normalize: bool) -> np.ndarray:
    """Returns-to-go minus the baseline (see the module docstring), concatenated in episode order: (N,)."""
    returns = [returns_to_go(trajectory.rewards, gamma) for trajectory in trajectories]
    if baseline == "time":
        longest = max(len(g) for g in returns)
        totals, counts = np.zeros(longest), np.zeros(longest)
        for g in returns:
            totals[: len(g)] += g
            counts[: len(g)] += 1
        per_step = totals / counts  # mean return-to-go of the episodes alive at step t
        advantages = np.concatenate([g - per_step[: len(g)] for g in returns])
    else:
        advantages = np.concatenate(returns)
        if baseline == "mean":
            advantages = advantages - advantages.mean()
    if normalize:
        advantages = advantages / (advantages.std() + 1e-8)
    return advantages


def chosen_log_probs(logits: Tensor, actions: np.ndarray) -> tuple[Tensor, Tensor]:
    """(log pi(action | obs) (N,), log pi (N, 2)) from logits (N, 2)."""
    log_probs = functional.log_softmax(logits, axis=-1)  # (N, 2)
    one_hot = np.eye(logits.shape[-1], dtype=np.float64)[actions]  # (N, 2)
    return (log_probs * one_hot).sum(axis=1), log_probs


def make_batch(policy: MLPPolicy, trajectories: Sequence[Trajectory], settings: CartPoleSettings) -> PolicyBatch:
    observations = np.concatenate([t.observations for t in trajectories]).astype(np.float32)
    actions = np.concatenate([t.actions for t in trajectories]).astype(np.int64)
    advantages = compute_advantages(trajectories, settings.gamma, settings.baseline, settings.normalize_advantages)
    with no_grad():  # the old log-probabilities through the same forward the update uses: first ratio is exactly 1
        old, _ = chosen_log_probs(policy(observations), actions)
    return PolicyBatch(observations, actions, advantages.astype(np.float32), old.numpy().astype(np.float32))


# -- the update (the part a GPU backend may run) ----------------------------------------------------
def policy_loss(policy: MLPPolicy, batch: PolicyBatch, *, clip_ratio: float, entropy_bonus: float) -> Tensor:
    """PPO's clipped surrogate, negated, minus the entropy bonus; a scalar Tensor.

    ratio = exp(log pi - log pi_old); the objective per row is min(ratio * A, clip(ratio, 1-e, 1+e) * A).
    Where the clipped term is the smaller one its gradient is zero, so those rows are replaced by a
    constant (``where``), which gives min(...)'s value and gradient exactly.
    """
    logits = policy(tensor(batch.observations))  # (N, 2)
    log_prob, log_probs = chosen_log_probs(logits, batch.actions)  # (N,), (N, 2)
    ratio = (log_prob - batch.old_log_probs.astype(log_prob.dtype)).exp()  # (N,)
    advantages = batch.advantages.astype(log_prob.dtype)
    limit = np.where(advantages > 0, 1 + clip_ratio, 1 - clip_ratio)  # the ratio's bound per row
    # A row is clipped where its ratio is past the bound in the direction its advantage pulls. The mask is
    # made where the ratio lives, so a GPU update reads nothing back before the loss.
    backend = get_backend()
    past = backend.binary("sub", ratio.data, backend.from_numpy(limit.astype(advantages.dtype)))
    past = backend.binary("mul", past, backend.from_numpy(np.sign(advantages)))
    clipped = Tensor(backend.compare("gt", past, 0.0))
    surrogate = functional.where(clipped, limit * advantages, ratio * advantages)  # (N,)
    loss = -surrogate.mean()
    if entropy_bonus:
        entropy = -(log_probs.exp() * log_probs).sum(axis=1).mean()
        loss = loss - entropy_bonus * entropy
    return loss


def update_policy(
    policy: MLPPolicy,
    optimizer: Optimizer,
    batch: PolicyBatch,
    *,
    clip_ratio: float,
    entropy_bonus: float = 0.0,
    max_grad_norm: float = 0.0,
) -> float:
    """One step on ``batch``: forward, backward, optional gradient clipping, optimizer step; returns the loss."""
    optimizer.zero_grad()
    loss = policy_loss(policy, batch, clip_ratio=clip_ratio, entropy_bonus=entropy_bonus)
    loss.backward()
    if max_grad_norm > 0:
        clip_grad_norm(policy.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def policy_probe(policy: MLPPolicy, *, rows: int = 1024, seed: int = 0) -> Probe:
    """The device probe of CartPole: ``update_policy`` (Adam, lr 0.01, clip ratio 0.2) of a copy of ``policy`` on
    a synthetic batch of ``rows`` steps, the size of a unit's experience."""
    build = copier(policy, seed)
    rng = np.random.default_rng(seed)
    width = policy.config.sizes[0]
    batch = PolicyBatch(rng.normal(size=(rows, width)).astype(np.float32), rng.integers(0, 2, size=rows),
                        rng.normal(size=rows).astype(np.float32), np.full(rows, np.log(0.5), np.float32))

    def make_step() -> Step:
        copy = build()
        optimizer = Adam(copy.parameters(), lr=0.01)

        async def step() -> float:
            return update_policy(copy, optimizer, batch, clip_ratio=0.2)

        return step

    return make_step


def make_optimizer(policy: MLPPolicy, settings: CartPoleSettings) -> Optimizer:
    if settings.optimizer == "sgd":
        return SGD(policy.parameters(), lr=settings.lr)
    return Adam(policy.parameters(), lr=settings.lr)


# -- the task --------------------------------------------------------------------------------------
class CartPoleTask(Task):
    name = "cartpole"
    kind = "experience"
    metric = "greedy_return"
    higher_is_better = True
    Settings = CartPoleSettings
    settings: CartPoleSettings
    # A rounding difference between Pyodide and native CPython (last bits of a matmul) can flip one action; the
    # episode then forks. Measured in headless Chromium: 58 of 1,000 units forked, 28 by more than 1% of their
    # update (at most 19%), so a replay cannot tell such an honest peer from a cheat.
    replay_across_engines = False

    def crosses_boundary(self) -> str:
        return ("No data crosses: each peer receives the policy's weights, a seed and an episode count, plays "
                "CartPole episodes itself and sends back only new weights and summary numbers.")

    def model_config(self) -> dict[str, Any]:
        return preset(self.settings.model).to_dict()

    def build_model(self, seed: int) -> MLPPolicy:
        return MLPPolicy(preset(self.settings.model), seed)

    def episodes_per_unit(self) -> int:
        return self.settings.episodes_per_unit

    def max_examples_per_unit(self) -> int:
        """Every episode ends by the time limit: a unit sees at most episodes x 500 steps."""
        return self.settings.episodes_per_unit * MAX_EPISODE_STEPS

    def device_probe(self, *, seed: int = 0, **options: Any) -> Probe | None:
        """``policy_probe`` of the initial policy; option ``rows`` (default 1024) sets the batch size."""
        return policy_probe(self.build_model(seed), seed=seed, **options)

    def policy(self, weights: np.ndarray) -> MLPPolicy:
        model = self.load(weights)
        assert isinstance(model, MLPPolicy)
        return model

    def eval_reset_seeds(self) -> np.ndarray:
        seeds = [episode_seeds(self.settings.eval_seed, i)[0] for i in range(self.settings.eval_episodes)]
        return np.array(seeds, dtype=np.int64)

    def prepare(self, host: HostServices | None = None) -> TaskData:
        return TaskData(num_units=self.settings.units, units=None, validation={"reset_seeds": self.eval_reset_seeds()})

    def play(self, weights: np.ndarray, seed: int, episodes: int) -> list[Trajectory]:
        """The unit's episodes with the stochastic policy held by ``weights`` (CPU)."""
        layers = policy_layers(self.policy(weights))
        return play_episodes(lambda obs: policy_probabilities(layers, obs), episodes, seed,
                             max_episode_steps=self.settings.max_episode_steps)

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        if unit.episodes < 1:
            raise TaskError(f"cartpole: a unit needs an episode budget >= 1, got {unit.episodes}")
        s = self.settings
        trajectories = self.play(weights, unit.seed, unit.episodes)
        policy = self.policy(weights)
        batch = make_batch(policy, trajectories, s)
        optimizer = make_optimizer(policy, s)
        rng = np.random.default_rng(np.random.SeedSequence([unit.seed, 23]))  # minibatch order only
        losses = []
        for _ in range(s.update_epochs):
            order = rng.permutation(len(batch)) if s.minibatches > 1 else np.arange(len(batch))
            for rows in np.array_split(order, min(s.minibatches, len(batch))):
                losses.append(update_policy(policy, optimizer, batch.subset(rows), clip_ratio=s.clip_ratio,
                                            entropy_bonus=s.entropy_bonus, max_grad_norm=s.max_grad_norm))
        lengths = [t.length for t in trajectories]
        metrics = {"mean_return": float(np.mean([t.total_reward for t in trajectories])),
                   "max_return": float(max(t.total_reward for t in trajectories)),
                   "episodes": float(len(trajectories)), "loss": float(losses[-1])}
        return UnitResult(self.flat_weights(policy), num_examples=int(sum(lengths)), metrics=metrics)

    def _reset_seeds(self, validation: Mapping[str, np.ndarray]) -> list[int]:
        seeds = validation.get("reset_seeds")
        return [int(s) for s in (self.eval_reset_seeds() if seeds is None else seeds)]

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        layers = policy_layers(self.policy(weights))
        returns = greedy_returns(layers, self._reset_seeds(validation), self.settings.max_episode_steps)
        return {"greedy_return": float(returns.mean()), "eval_min": float(returns.min()),
                "eval_max": float(returns.max())}

    respond_hint = "an episode seed, e.g. 7"

    def respond(self, weights: np.ndarray, prompt: str) -> dict[str, Any]:
        """One greedy episode from the reset seed in ``prompt``: its frames (cart position, pole angle)."""
        try:
            seed = int(prompt.strip() or "0")
        except ValueError as error:
            raise TaskError(f"type an episode seed (a whole number), not {prompt!r}") from error
        layers = policy_layers(self.policy(weights))
        env = CartPoleBatch(1, self.settings.max_episode_steps)
        obs = env.reset([seed])
        frames = [[float(obs[0, 0]), float(obs[0, 2])]]
        done = False
        while not done:
            logits = policy_logits(layers, obs)
            obs, _, terminated, truncated = env.step((logits[:, 1] > logits[:, 0]).astype(np.int64))
            frames.append([float(obs[0, 0]), float(obs[0, 2])])
            done = bool(terminated[0] or truncated[0])
        return {"frames": frames, "text": f"episode seed {seed}: return {len(frames) - 1}", "prompt": prompt}

    def samples(self, weights: np.ndarray, validation: Mapping[str, np.ndarray], count: int = 6) -> list[Sample]:
        seeds = self._reset_seeds(validation)[:count]
        returns = greedy_returns(policy_layers(self.policy(weights)), seeds, self.settings.max_episode_steps)
        limit = self.settings.max_episode_steps
        return [Sample(f"episode seed {seed}: return {ret:.0f} ({'truncated' if ret >= limit else 'fell'})",
                       ok=bool(ret >= limit)) for seed, ret in zip(seeds, returns, strict=True)]
