"""Byte-level language modelling on the volunteers' own text files (``--task bytetext-local``): the text stays in
their browsers.

The model and the training step are bytetext's (``runtime.tasks.bytetext``: ``bytelm-2.3mb`` by default, Adam on
random windows); what differs is where the bytes come from. A peer chooses UTF-8 text files in the page; each is
read as its bytes plus a blank line (``parse_local``: a file that is not UTF-8, holds NUL bytes or is empty is
refused with the line). The peer's text is cut into 1 kB blocks and a seeded share of them (``holdout``) is held out
for federated evaluation (validation loss and bits per byte of the weights the peer was handed). A unit trains on
at most ``max_bytes_per_unit`` of the peer's bytes (a seeded contiguous span of a longer text), and reports them as
its example count. The host validates only when given text of its own (``validation_files``); otherwise the session
is judged by federated evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.data.text import lm_windows, validation_windows
from runtime.device_probe import Probe
from runtime.models.transformer import Transformer, TransformerConfig, preset
from runtime.tasks.base import HostServices, Sample, Task, TaskData, TaskError, UnitResult, WorkUnit
from runtime.tasks.bytetext import PROMPTS
from runtime.tasks.lm import bits_per_token, lm_probe, mean_loss, train_lm
from runtime.tasks.local import LocalDataError, decode_text

BLOCK_BYTES = 1024  # the held-out share is drawn in blocks of this many bytes (a window needs neighbours)


@dataclass(frozen=True)
class ByteTextLocalSettings:
    units: int = 12  # work units per pass: each is "train on your text" for one peer
    model: str = "bytelm-2.3mb"
    n_layer: int = 0  # 0: the preset's (a smaller model for tests and slow machines)
    n_embd: int = 0
    n_head: int = 0
    context: int = 0
    steps: int = 8  # Adam steps per unit
    batch_size: int = 16
    lr: float = 3e-3
    holdout: float = 0.1  # share of a peer's 1 kB blocks held out for federated evaluation
    max_bytes_per_unit: int = 1 << 20  # the relay's cap on a unit's example count (bytes)
    local_eval_windows: int = 64  # windows of the held-out text a peer evaluates on
    validation_files: tuple[str, ...] = ()  # host text to validate on; empty: federated evaluation only
    validation_windows: int = 256
    sample_tokens: int = 48

    def __post_init__(self) -> None:
        object.__setattr__(self, "validation_files", tuple(self.validation_files))
        if self.units < 1 or self.steps < 1 or self.batch_size < 1 or self.max_bytes_per_unit < 1:
            raise ValueError("units, steps, batch_size and max_bytes_per_unit must be positive")
        if not 0 <= self.holdout < 1:
            raise ValueError(f"holdout must be in [0, 1), got {self.holdout}")


class ByteTextLocalTask(Task):
    name = "bytetext-local"
    kind = "local"
    metric = "val_loss"
    respond_hint = "The "
    local_accept = ".txt,.md,.rst,.csv,.py,text/plain"
    local_hint = "UTF-8 text files (notes, books, code): the model learns to continue text byte by byte"
    Settings = ByteTextLocalSettings
    settings: ByteTextLocalSettings

    def crosses_boundary(self) -> str:
        host = " The host validates on its own text." if self.settings.validation_files else ""
        return ("Only the weights: each peer trains on text files it chooses in its own page, and the text stays in "
                "its browser. Peers send back trained weights and the loss of the weights they were handed on a "
                "held-out tenth of their own text." + host)

    def config(self) -> TransformerConfig:
        s = self.settings
        overrides = {k: v for k, v in (("n_layer", s.n_layer), ("n_embd", s.n_embd), ("n_head", s.n_head),
                                       ("context", s.context)) if v}
        return preset(s.model, **overrides)

    def model_config(self) -> dict[str, Any]:
        return self.config().to_dict()

    def build_model(self, seed: int) -> Transformer:
        return Transformer(self.config(), seed)

    def device_probe(self, *, seed: int = 0, **options: Any) -> Probe | None:
        return lm_probe(self.build_model(seed), seed=seed, **({"batch_size": self.settings.batch_size} | options))

    def prepare(self, host: HostServices | None = None) -> TaskData:
        validation: dict[str, np.ndarray] = {}
        if self.settings.validation_files:
            try:
                text = b"\n\n".join(Path(name).read_bytes() for name in self.settings.validation_files)
            except OSError as error:
                raise TaskError(f"bytetext-local: cannot read {error.filename}: {error.strerror}") from error
            validation = {"bytes": np.frombuffer(text, dtype=np.uint8).astype(np.int32)}
        return TaskData(num_units=self.settings.units, validation=validation)

    # -- a peer's own text ----------------------------------------------------------------------------
    def parse_local(self, name: str, content: bytes) -> np.ndarray:
        """The file's bytes (UTF-8 text) and a blank line, as uint8."""
        text = decode_text(name, content)
        if "\0" in text:
            raise LocalDataError(name, "holds NUL bytes: not a text file", text[:text.index("\0")].count("\n") + 1)
        return np.frombuffer((text + "\n\n").encode("utf-8"), dtype=np.uint8)

    def split_local(self, examples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A seeded ``holdout`` share of the text's 1 kB blocks (at least one of two or more) held out, in order."""
        blocks = [examples[i:i + BLOCK_BYTES] for i in range(0, len(examples), BLOCK_BYTES)]
        held = min(len(blocks) - 1, max(1, round(self.settings.holdout * len(blocks)))) \
            if len(blocks) >= 2 and self.settings.holdout > 0 else 0
        chosen = set(np.random.default_rng(0).choice(len(blocks), size=held, replace=False).tolist()) if held else set()
        train = [b for i, b in enumerate(blocks) if i not in chosen]
        test = [b for i, b in enumerate(blocks) if i in chosen]
        return np.concatenate(train), (np.concatenate(test) if test else examples[:0])

    def min_local_examples(self) -> int:
        return self.config().context + 1

    def max_examples_per_unit(self) -> int:
        return self.settings.max_bytes_per_unit

    def sample_local_files(self) -> list[tuple[str, bytes]]:
        return [("sample.txt", b"A made-up note for the host's check of one unit. " * 8)]

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        if unit.data is None:
            raise TaskError("bytetext-local: a unit trains on the peer's own text")
        data = unit.data
        rng = np.random.default_rng(np.random.SeedSequence([unit.seed, 11]))
        cap = self.settings.max_bytes_per_unit
        if len(data) > cap:
            start = int(rng.integers(0, len(data) - cap + 1))
            data = data[start:start + cap]
        model = self.load(weights)
        count = self.settings.steps * self.settings.batch_size
        inputs, targets = lm_windows(data, self.config().context, count, rng)
        metrics = train_lm(model, inputs, targets, steps=self.settings.steps, batch_size=self.settings.batch_size,
                           lr=self.settings.lr, seed=unit.seed)
        return UnitResult(self.flat_weights(model), num_examples=int(len(data)), metrics=metrics)

    def scores(self, weights: np.ndarray, data: np.ndarray, windows: int) -> dict[str, float]:
        context = self.config().context
        if len(data) < context + 1:
            return {}
        inputs, targets = validation_windows(data, context, windows)
        loss = mean_loss(self.load(weights), inputs, targets)
        return {"val_loss": loss, "bits_per_byte": bits_per_token(loss)}

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        return self.scores(weights, validation["bytes"], self.settings.validation_windows) if "bytes" in validation \
            else {}

    def evaluate_local(self, weights: np.ndarray, examples: np.ndarray) -> dict[str, float]:
        """Federated evaluation: the loss on windows of the peer's held-out text."""
        return self.scores(weights, examples, self.settings.local_eval_windows)

    def respond(self, weights: np.ndarray, prompt: str) -> dict[str, Any]:
        model = self.load(weights)
        data = (list(prompt.encode()) or list(b" "))[-(model.config.context - 1):]
        room = min(self.settings.sample_tokens, model.config.context - len(data))
        generated = np.asarray(model.generate(np.array([data], dtype=np.int64), room, temperature=0.0))[0]
        return {"text": bytes(int(t) for t in generated).decode("utf-8", errors="replace"), "prompt": prompt}

    def samples(self, weights: np.ndarray, validation: Mapping[str, np.ndarray], count: int = 3) -> list[Sample]:
        """Greedy continuations of a few prompts (no held-out text needed: they work without host validation)."""
        model = self.load(weights)
        prompts = np.array([list(p.encode()) for p in PROMPTS[:count]], dtype=np.int64)
        room = min(self.settings.sample_tokens, model.config.context - prompts.shape[1])
        generated = np.asarray(model.generate(prompts, room, temperature=0.0))
        return [Sample(text=bytes(int(t) for t in row).decode("utf-8", errors="replace")) for row in generated]
