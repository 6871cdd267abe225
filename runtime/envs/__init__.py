"""Environments that generate their own experience (reinforcement learning tasks)."""

from __future__ import annotations

from runtime.envs.cartpole import CartPole, CartPoleBatch, CartPoleError, Trajectory, episode_seeds, play_episodes

__all__ = ["CartPole", "CartPoleBatch", "CartPoleError", "Trajectory", "episode_seeds", "play_episodes"]
