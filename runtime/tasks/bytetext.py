"""Byte-level language modelling: any text, or by default CPython's own ``pydoc_data.topics``.

The host cuts the bytes into C chunks (55 by default) and holds out an interleaved 10% for validation
(see ``runtime.data.text``). A peer trains ``bytelm-2.3mb`` on random windows of its chunk. Metric:
validation loss in nats per byte, and bits per byte; samples: text generated from a few prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.data.text import byte_chunks, default_corpus, lm_windows, validation_windows
from runtime.device_probe import Probe
from runtime.models.transformer import Transformer, TransformerConfig, preset
from runtime.tasks.base import HostServices, Sample, Task, TaskData, TaskError, UnitResult, WorkUnit
from runtime.tasks.lm import bits_per_token, check_recipe, lm_probe, mean_loss, train_lm

# Prompts of equal length so the samples come from one batched generation (it sits beside every round).
PROMPTS = ("The ", "When", "A fu")


@dataclass(frozen=True)
class ByteTextSettings:
    files: tuple[str, ...] = ()  # text files; empty means the built-in pydoc corpus
    chunks: int = 55
    validation_fraction: float = 0.1
    data_seed: int = 0
    model: str = "bytelm-2.3mb"
    # the local training recipe: `steps` steps of `optimizer` on batches of `batch_size` windows per unit
    steps: int = 8
    batch_size: int = 16
    lr: float = 3e-3
    optimizer: str = "adam"  # adam or sgd (runtime.tasks.lm.LOCAL_OPTIMIZERS); a fresh one per unit
    momentum: float = 0.0  # sgd only: heavy-ball momentum (0: plain SGD, as the clients of Reddi et al. 2021)
    clip: float = 1.0  # clip each step's gradients to this global norm (0: no clipping)
    validation_windows: int = 256
    # hold out every other validation window as a report split: val_loss (what the session selects its best
    # round on, and a study its settings on) comes from the others, report_loss from these
    report_half: bool = False
    sample_tokens: int = 48

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))
        if self.chunks < 1 or self.steps < 1 or self.batch_size < 1:
            raise ValueError("chunks, steps and batch_size must be positive")
        if not self.lr > 0:
            raise ValueError(f"bytetext: lr must be > 0, got {self.lr!r}")
        check_recipe("bytetext", self.optimizer, self.momentum, self.clip)


class ByteTextTask(Task):
    name = "bytetext"
    kind = "data"
    metric = "val_loss"
    respond_hint = "The "
    Settings = ByteTextSettings
    settings: ByteTextSettings
    # Adam divides each gradient by its running magnitude, so on coordinates whose gradients are nearly zero
    # (bytes a chunk hardly uses) the last-bit differences between the browser's SIMD matmul and native BLAS
    # become whole steps. Measured in headless Chromium: a browser unit differed from its native replay by up
    # to 40% of its update (62 units), so a replay cannot judge a bytetext result; the other checks remain.
    replay_across_engines = False

    def crosses_boundary(self) -> str:
        source = ", ".join(self.settings.files) or "CPython's pydoc topics (public documentation)"
        return (f"Peers receive one chunk of raw text bytes from {source} per assignment (about 1/"
                f"{self.settings.chunks} of it) and the model weights; the validation split stays on the host.")

    def config(self) -> TransformerConfig:
        return preset(self.settings.model)

    def model_config(self) -> dict[str, Any]:
        return self.config().to_dict()

    def build_model(self, seed: int) -> Transformer:
        return Transformer(self.config(), seed)

    def device_probe(self, *, seed: int = 0, **options: Any) -> Probe | None:
        """``lm_probe`` of the initial model on batches of ``batch_size`` (an option; default the setting)."""
        return lm_probe(self.build_model(seed), seed=seed, **({"batch_size": self.settings.batch_size} | options))

    def corpus(self) -> bytes:
        if not self.settings.files:
            return default_corpus().encode("utf-8")
        try:
            return b"\n\n".join(Path(name).read_bytes() for name in self.settings.files)
        except OSError as error:
            raise TaskError(f"bytetext: cannot read {error.filename}: {error.strerror}") from error

    def prepare(self, host: HostServices | None = None) -> TaskData:
        chunks, validation = byte_chunks(self.corpus(), self.settings.chunks, self.settings.validation_fraction,
                                         self.settings.data_seed)
        return TaskData(num_units=len(chunks), units=[c.astype(np.int32) for c in chunks],
                        validation={"bytes": validation.astype(np.int32)})

    def unit_examples(self, unit: WorkUnit) -> int:
        """The chunk's bytes, as ``train_unit`` counts them."""
        return int(unit.data.size) if unit.data is not None else 0

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        if unit.data is None:
            raise TaskError("bytetext: a unit needs its chunk of bytes")
        model = self.load(weights)
        context = self.config().context
        rng = np.random.default_rng(np.random.SeedSequence([unit.seed, 11]))
        count = self.settings.steps * self.settings.batch_size
        inputs, targets = lm_windows(unit.data, context, count, rng)
        metrics = train_lm(model, inputs, targets, steps=self.settings.steps, batch_size=self.settings.batch_size,
                           lr=self.settings.lr, seed=unit.seed, clip=self.settings.clip,
                           optimizer=self.settings.optimizer, momentum=self.settings.momentum)
        return UnitResult(self.flat_weights(model), num_examples=int(unit.data.size), metrics=metrics)

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        model = self.load(weights)
        inputs, targets = validation_windows(validation["bytes"], self.config().context,
                                             self.settings.validation_windows)
        if not self.settings.report_half:
            loss = mean_loss(model, inputs, targets)
            return {"val_loss": loss, "bits_per_byte": bits_per_token(loss)}
        loss = mean_loss(model, inputs[0::2], targets[0::2])
        report = mean_loss(model, inputs[1::2], targets[1::2])
        return {"val_loss": loss, "bits_per_byte": bits_per_token(loss), "report_loss": report}

    def respond(self, weights: np.ndarray, prompt: str) -> dict[str, Any]:
        """The text continued greedily by ``sample_tokens`` bytes (the prompt is cut to the model's context)."""
        model = self.load(weights)
        data = list(prompt.encode()) or list(b" ")
        data = data[-(model.config.context - 1):]
        room = min(self.settings.sample_tokens, model.config.context - len(data))
        generated = np.asarray(model.generate(np.array([data], dtype=np.int64), room, temperature=0.0))[0]
        return {"text": bytes(int(t) for t in generated).decode("utf-8", errors="replace"), "prompt": prompt}

    def samples(self, weights: np.ndarray, validation: Mapping[str, np.ndarray], count: int = 3) -> list[Sample]:
        model = self.load(weights)
        prompts = np.array([list(p.encode()) for p in PROMPTS[:count]], dtype=np.int64)  # (count, 4)
        generated = np.asarray(model.generate(prompts, self.settings.sample_tokens, temperature=0.0))
        return [Sample(text=bytes(int(t) for t in row).decode("utf-8", errors="replace")) for row in generated]
