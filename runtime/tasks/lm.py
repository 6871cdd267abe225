"""Training and evaluating a causal language model on (inputs, targets) arrays: the functions the transformer
language-model task (``runtime.tasks.lm_task.LMTask``) is made of."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from runtime.autograd import no_grad
from runtime.device_probe import Probe, Step, copier
from runtime.models.transformer import Transformer
from runtime.optim import SGD, Adam, Optimizer
from runtime.train_step import lm_step, lm_step_async

# The local optimizers a language-model task's recipe may name (``runtime.tasks.lm_recipe.LMRecipe.optimizer``).
LOCAL_OPTIMIZERS = ("adam", "sgd")


def local_optimizer(model: Transformer, optimizer: str, lr: float, momentum: float) -> Optimizer:
    """A fresh local optimizer: Adam (torch defaults: betas 0.9, 0.999) or SGD (heavy-ball ``momentum``, 0: plain)."""
    if optimizer == "sgd":
        return SGD(model.parameters(), lr=lr, momentum=momentum)
    if optimizer == "adam":
        return Adam(model.parameters(), lr=lr)
    raise ValueError(f"unknown local optimizer {optimizer!r}; choose one of {', '.join(LOCAL_OPTIMIZERS)}")


def local_steps(model: Transformer, inputs: np.ndarray, targets: np.ndarray, plan: Sequence[np.ndarray],
                lr_at: Callable[[int], float], *, seed: int, clip: float, optimizer: str = "adam",
                momentum: float = 0.0) -> list[float]:
    """One optimizer step per batch of row indices in ``plan`` with a fresh optimizer (peers keep no state
    between units, so a retried unit repeats exactly); returns the losses. ``lr_at(step)`` is the learning rate;
    ``clip`` > 0 clips the gradients' global norm first."""
    model.train()
    model.set_dropout_seed(seed)
    local = local_optimizer(model, optimizer, lr_at(0), momentum)
    losses = []
    for step, rows in enumerate(plan):
        local.lr = lr_at(step)
        loss = lm_step(model, local, inputs[rows], targets[rows], clip=clip)
        losses.append(float(loss.numpy()))
    return losses


def lm_probe(model: Transformer, *, batch_size: int = 8, seed: int = 0) -> Probe:
    """The device probe of a language-model task: an Adam step (lr 1e-3, clipping at norm 1 on the device, one
    read-back) of a copy of ``model`` on ``batch_size`` random sequences of its full context."""
    build = copier(model, seed)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, model.config.vocab_size, size=(batch_size, model.config.context + 1))

    def transformer_probe() -> Step:
        transformer = build()
        optimizer = Adam(transformer.parameters(), lr=1e-3)
        return lambda: lm_step_async(transformer, optimizer, tokens)

    return transformer_probe


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


def pass_batches(count: int, batch_size: int, *, epochs: int, steps: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Row batches for local training: ``epochs`` shuffled passes over ``count`` rows, cut into batches of
    ``batch_size`` (a pass's last batch may be short); with ``steps > 0``, exactly that many full-sized batches
    taken from as many passes as needed instead."""
    batch_size = min(batch_size, count)
    out: list[np.ndarray] = []
    passes = epochs if steps <= 0 else -(-steps * batch_size // count) + 1
    for _ in range(passes):
        order = rng.permutation(count)
        if steps > 0:
            out.append(order)
        else:
            out += [order[start:start + batch_size] for start in range(0, count, batch_size)]
    if steps > 0:
        rows = np.concatenate(out)
        out = [rows[i * batch_size:(i + 1) * batch_size] for i in range(steps)]
    return out


def warmup_cosine(lr: float, steps: int, *, warmup: int, final_lr_ratio: float) -> Callable[[int], float]:
    """The learning rate of step ``step`` of ``steps``: it rises linearly over ``warmup`` steps, then follows a
    cosine from ``lr`` down to ``lr * final_lr_ratio`` at the last step (1.0: constant)."""
    decay_steps = max(1, steps - warmup - 1)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / decay_steps)
        return lr * (final_lr_ratio + (1 - final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    return lr_at


def greedy_continuations(model: Transformer, prompts: np.ndarray, lengths: np.ndarray, max_new_tokens: int, *,
                         stop_token: int | None = None, batch_size: int = 256) -> list[np.ndarray]:
    """Greedy continuations of many prompts, batched: prompts of equal length are decoded together.

    prompts: (M, P) int32 right-padded; lengths: (M,) the real length of each. Returns M arrays of the
    ``max_new_tokens`` (or fewer, when every row in a batch has emitted ``stop_token``) generated ids.
    """
    out: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(prompts)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        for start in range(0, len(rows), batch_size):
            chosen = rows[start:start + batch_size]
            generated = model.generate(prompts[chosen, :length], max_new_tokens, temperature=0.0,
                                       stop_token=stop_token)
            for row, ids in zip(chosen.tolist(), generated[:, length:], strict=True):
                out[row] = ids
    return out
