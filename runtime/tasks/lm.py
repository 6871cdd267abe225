"""Training and evaluating a causal language model on (inputs, targets) arrays: shared by the text tasks."""

from __future__ import annotations

import math

import numpy as np

from runtime.autograd import no_grad
from runtime.models.transformer import Transformer
from runtime.optim import Adam, clip_grad_norm


def train_lm(model: Transformer, inputs: np.ndarray, targets: np.ndarray, *, steps: int, batch_size: int,
             lr: float, seed: int, clip: float = 1.0) -> dict[str, float]:
    """``steps`` Adam steps on batches drawn with a generator seeded by ``seed``; returns local metrics.

    A fresh optimizer per unit: peers keep no state between assignments, so a retried unit repeats exactly.
    inputs, targets: (N, T) int32; targets hold -100 where the loss should not look.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7]))
    model.train()
    model.set_dropout_seed(seed)
    optimizer = Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        rows = rng.integers(0, len(inputs), size=min(batch_size, len(inputs)))
        _, loss = model(inputs[rows], targets[rows])
        assert loss is not None
        optimizer.zero_grad()
        loss.backward()
        if clip > 0:
            clip_grad_norm(model.parameters(), clip)
        optimizer.step()
        losses.append(float(loss.numpy()))
    return {"train_loss": float(np.mean(losses[-max(1, steps // 4):])), "first_loss": losses[0], "steps": steps}


def mean_loss(model: Transformer, inputs: np.ndarray, targets: np.ndarray, *, batch_size: int = 64) -> float:
    """Mean cross-entropy over every counted target position (nats per token)."""
    model.eval()
    total, count = 0.0, 0
    with no_grad():
        for start in range(0, len(inputs), batch_size):
            rows_t = targets[start:start + batch_size]
            _, loss = model(inputs[start:start + batch_size], rows_t)
            assert loss is not None
            counted = int((rows_t != -100).sum())
            total += float(loss.numpy()) * counted
            count += counted
    return total / max(count, 1)


def bits_per_token(loss_nats: float) -> float:
    return loss_nats / math.log(2)
