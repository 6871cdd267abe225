"""One transformer language-model task, which the built-in text tasks specialise by their tokens.

:class:`LMTask` owns what every language-model task shares: the model (a ``runtime.models.transformer`` preset
named by the ``model`` setting, with the task's overrides), the local recipe (``runtime.tasks.lm_recipe.LMRecipe``,
which the task's ``Settings`` inherit: ``steps``, ``batch_size``, ``lr``, ``optimizer`` adam|sgd, ``momentum``,
``clip``; a fresh optimizer per unit, so a retried unit repeats exactly), training a unit, the device probe, and the
loss that validation reports. A subclass says only where its tokens come from and how they are prepared and judged
(as nanoGPT keeps one model and one training script, and datasets differ only in how they are prepared):

- ``unit_tokens(unit)``: the unit's (inputs, targets) arrays and the example count it reports (required);
- ``prepare``, ``validate``, ``samples``, ``respond`` and ``crosses_boundary``: its data and how it is judged;
- optionally ``model_overrides()`` / ``base_config()`` and ``vocab_size()`` (a tokenizer's), ``batch_plan`` (which
  rows each step takes; default ``steps`` random batches) and ``lr_schedule`` (default: constant ``lr``).

:class:`ByteLMTask` is the byte-level one (every byte a token): a unit's tokens are random windows of its bytes,
validation is the loss in nats and bits per byte on evenly spaced windows, samples and answers are greedy
continuations. ``bytetext`` (a corpus the host cuts into chunks) and ``bytetext-local`` (a peer's own files) are
it; ``arith`` (generated problems, a character or BPE tokenizer, judged on exact answers) is an ``LMTask``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from runtime.data.text import lm_windows, validation_windows
from runtime.device_probe import Probe
from runtime.models.transformer import Transformer, TransformerConfig, preset
from runtime.tasks.base import Sample, Task, TaskError, UnitResult, WorkUnit
from runtime.tasks.lm import bits_per_token, lm_probe, local_steps, mean_loss
from runtime.tasks.lm_recipe import LMRecipe
from runtime.tasks.settings import setting

# Prompts of equal length so a byte task's samples come from one batched generation (it sits beside every round).
PROMPTS = ("The ", "When", "A fu")


class LMTask(Task):
    """A causal transformer trained by the local recipe on the token arrays ``unit_tokens`` gives; its ``Settings``
    inherit the recipe (``runtime.tasks.lm_recipe.LMRecipe``)."""

    settings: LMRecipe

    # -- the model ------------------------------------------------------------------------------
    def model_overrides(self) -> dict[str, Any]:
        """Fields of the preset the settings replace (default none)."""
        return {}

    def vocab_size(self) -> int | None:
        """The vocabulary, where a tokenizer sets it (default None: the preset's)."""
        return None

    def base_config(self) -> TransformerConfig:
        return preset(self.settings.model, **self.model_overrides())

    def config(self) -> TransformerConfig:
        base = self.base_config()
        vocab = self.vocab_size()
        return base if vocab is None else dataclasses.replace(base, vocab_size=vocab)

    def model_config(self) -> dict[str, Any]:
        return self.config().to_dict()

    def build_model(self, seed: int) -> Transformer:
        return Transformer(self.config(), seed)

    def device_probe(self, *, seed: int = 0, **options: Any) -> Probe | None:
        """``lm_probe`` of the initial model on batches of ``batch_size`` (an option; default the setting)."""
        return lm_probe(self.build_model(seed), seed=seed, **({"batch_size": self.settings.batch_size} | options))

    # -- training a unit ------------------------------------------------------------------------
    def unit_tokens(self, unit: WorkUnit) -> tuple[np.ndarray, np.ndarray, int]:
        """(inputs, targets, examples): (N, T) int32 arrays (targets -100 where the loss does not look) and the
        example count the unit reports."""
        raise NotImplementedError

    def unit_flops(self, unit: WorkUnit, num_examples: int) -> float:
        """6 FLOPs per weight per token the unit trains on: its batches' rows (``batch_plan``) times their length."""
        inputs, _, _ = self.unit_tokens(unit)
        plan = self.batch_plan(len(inputs), np.random.default_rng(np.random.SeedSequence([unit.seed, 7])))
        return 6.0 * self.spec().size * sum(len(rows) for rows in plan) * inputs.shape[1]

    def batch_plan(self, count: int, rng: np.random.Generator) -> list[np.ndarray]:
        """The rows of each step's batch: ``steps`` batches of ``batch_size`` rows drawn at random."""
        size = min(self.settings.batch_size, count)
        return [rng.integers(0, count, size=size) for _ in range(self.settings.steps)]

    def lr_schedule(self, unit: WorkUnit, steps: int) -> Callable[[int], float]:
        """The learning rate of each of the unit's ``steps`` steps: ``lr`` throughout."""
        lr = self.settings.lr
        return lambda step: lr

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        inputs, targets, examples = self.unit_tokens(unit)
        model = self.load(weights)
        s = self.settings
        plan = self.batch_plan(len(inputs), np.random.default_rng(np.random.SeedSequence([unit.seed, 7])))
        losses = local_steps(model, inputs, targets, plan, self.lr_schedule(unit, len(plan)), seed=unit.seed,
                             clip=s.clip, optimizer=s.optimizer, momentum=s.momentum)
        metrics = {"train_loss": float(np.mean(losses[-max(1, len(plan) // 4):])), "first_loss": losses[0],
                   "steps": len(plan)}
        return UnitResult(self.flat_weights(model), num_examples=examples, metrics=metrics)


@dataclass(frozen=True, kw_only=True)
class ByteSettings(LMRecipe):
    """The recipe, and what a byte-level task's samples and answers continue a prompt by."""

    sample_tokens: int = field(default=48, metadata=setting(help="bytes a sample or an answer continues its prompt by"))


def decode_bytes(ids: np.ndarray) -> str:
    return bytes(int(t) for t in ids).decode("utf-8", errors="replace")


class ByteLMTask(LMTask):
    """Every byte a token: a unit trains on ``steps * batch_size`` random windows of its bytes (a seeded span of at
    most ``max_examples_per_unit()`` of them, where the task caps it), and counts its bytes as its examples."""

    settings: ByteSettings
    respond_hint = "The "
    missing_data: ClassVar[str] = "a unit needs its bytes"  # the refusal of a unit without data, after the name

    def unit_flops(self, unit: WorkUnit, num_examples: int) -> float:
        """``steps * batch_size`` windows of ``context`` bytes, whatever the unit holds: a local unit's bytes stay in
        its peer's browser, and its count needs none of them."""
        return 6.0 * self.spec().size * self.settings.steps * self.settings.batch_size * self.config().context

    def unit_tokens(self, unit: WorkUnit) -> tuple[np.ndarray, np.ndarray, int]:
        if unit.data is None:
            raise TaskError(f"{self.name}: {self.missing_data}")
        data = unit.data
        rng = np.random.default_rng(np.random.SeedSequence([unit.seed, 11]))
        cap = self.max_examples_per_unit()
        if cap is not None and len(data) > cap:
            start = int(rng.integers(0, len(data) - cap + 1))
            data = data[start:start + cap]
        inputs, targets = lm_windows(data, self.config().context, self.settings.steps * self.settings.batch_size, rng)
        return inputs, targets, int(len(data))

    def byte_scores(self, weights: np.ndarray, data: np.ndarray, windows: int, *,
                    report_half: bool = False) -> dict[str, float]:
        """Loss (nats per byte) and bits per byte on ``windows`` evenly spaced windows of ``data``; with
        ``report_half`` every other window is held out of them and scored as ``report_loss``."""
        model = self.load(weights)
        inputs, targets = validation_windows(data, self.config().context, windows)
        if not report_half:
            loss = mean_loss(model, inputs, targets)
            return {"val_loss": loss, "bits_per_byte": bits_per_token(loss)}
        loss = mean_loss(model, inputs[0::2], targets[0::2])
        report = mean_loss(model, inputs[1::2], targets[1::2])
        return {"val_loss": loss, "bits_per_byte": bits_per_token(loss), "report_loss": report}

    def respond(self, weights: np.ndarray, prompt: str) -> dict[str, Any]:
        """The text continued greedily by ``sample_tokens`` bytes (the prompt is cut to the model's context)."""
        model = self.load(weights)
        data = (list(prompt.encode()) or list(b" "))[-(model.config.context - 1):]
        room = min(self.settings.sample_tokens, model.config.context - len(data))
        generated = np.asarray(model.generate(np.array([data], dtype=np.int64), room, temperature=0.0))[0]
        return {"text": decode_bytes(generated), "prompt": prompt}

    def samples(self, weights: np.ndarray, validation: Mapping[str, np.ndarray], count: int = 3) -> list[Sample]:
        """Greedy continuations of a few fixed prompts by ``sample_tokens`` bytes, as far as the context reaches
        (as ``respond``; they need no held-out text)."""
        model = self.load(weights)
        prompts = np.array([list(p.encode()) for p in PROMPTS[:count]], dtype=np.int64)  # (count, 4)
        room = min(self.settings.sample_tokens, model.config.context - prompts.shape[1])
        generated = np.asarray(model.generate(prompts, room, temperature=0.0))
        return [Sample(text=decode_bytes(row)) for row in generated]
