"""Byte-level language modelling on the volunteers' own text files (``--task bytetext-local``): the text stays in
their browsers.

The transformer LM task's byte-level form (``runtime.tasks.lm_task.ByteLMTask``), as ``bytetext`` is: the same
model (``bytelm-2.3mb`` by default, with optional size overrides) and the same local recipe with the same defaults
(``steps`` 8 of ``optimizer`` adam or sgd, ``lr`` 3e-3, ``momentum`` 0, ``clip`` 1.0, ``batch_size`` 16 random
windows), so that bytetext's tuned recipes carry over; given the same bytes and seed a unit trains exactly as a
bytetext unit does. What differs is where the bytes come from. A peer chooses UTF-8 text files in the page; each is
read as its bytes plus a blank line (``parse_local``: a file that is not UTF-8, holds NUL bytes or is empty is
refused with the line). The peer's text is cut into 1 kB blocks and a seeded share of them (``holdout``) is held out
for federated evaluation (validation loss and bits per byte of the weights the peer was handed). A unit trains on
at most ``max_bytes_per_unit`` of the peer's bytes (a seeded contiguous span of a longer text), and reports them as
its example count. The host validates only when given text of its own (``validation_files``); otherwise the session
is judged by federated evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.tasks.base import HostServices, TaskData, TaskError
from runtime.tasks.lm_task import ByteLMTask, ByteSettings
from runtime.tasks.local import LocalDataError, decode_text
from runtime.tasks.settings import setting

BLOCK_BYTES = 1024  # the held-out share is drawn in blocks of this many bytes (a window needs neighbours)
SIZE = "0: the preset's (a smaller model for tests and slow machines)"


@dataclass(frozen=True, kw_only=True)
class ByteTextLocalSettings(ByteSettings):
    """bytetext's recipe with its defaults (``runtime.tasks.lm_recipe.LMRecipe``), the model's optional sizes, and
    how a peer's own text is used and judged."""

    units: int = field(default=12, metadata=setting(
        help="work units per pass: each is \"train on your text\" for one peer", minimum=1))
    n_layer: int = field(default=0, metadata=setting(help=f"transformer blocks; {SIZE}", minimum=0))
    n_embd: int = field(default=0, metadata=setting(help=f"embedding width; {SIZE}", minimum=0))
    n_head: int = field(default=0, metadata=setting(help=f"attention heads; {SIZE}", minimum=0))
    context: int = field(default=0, metadata=setting(help=f"tokens (bytes) a window holds; {SIZE}", minimum=0))
    holdout: float = field(default=0.1, metadata=setting(
        help="share of a peer's 1 kB blocks held out for federated evaluation", minimum=0, below=1))
    max_bytes_per_unit: int = field(default=1 << 20, metadata=setting(
        help="the relay's cap on a unit's example count (bytes)", minimum=1))
    local_eval_windows: int = field(default=64, metadata=setting(
        help="windows of the held-out text a peer evaluates on"))
    validation_files: tuple[str, ...] = field(default=(), metadata=setting(
        help="host text to validate on; empty: federated evaluation only"))
    validation_windows: int = field(default=256, metadata=setting(help="windows of the host's text validation scores"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "validation_files", tuple(self.validation_files))
        super().__post_init__()


class ByteTextLocalTask(ByteLMTask):
    name = "bytetext-local"
    kind = "local"
    metric = "val_loss"
    local_accept = ".txt,.md,.rst,.csv,.py,text/plain"
    local_hint = "UTF-8 text files (notes, books, code): the model learns to continue text byte by byte"
    Settings = ByteTextLocalSettings
    settings: ByteTextLocalSettings
    missing_data = "a unit trains on the peer's own text"

    def crosses_boundary(self) -> str:
        host = " The host validates on its own text." if self.settings.validation_files else ""
        return ("Only the weights: each peer trains on text files it chooses in its own page, and the text stays in "
                "its browser. Peers send back trained weights and the loss of the weights they were handed on a "
                "held-out tenth of their own text." + host)

    def model_overrides(self) -> dict[str, Any]:
        """The size settings that are set (0 keeps the preset's)."""
        s = self.settings
        return {k: v for k, v in (("n_layer", s.n_layer), ("n_embd", s.n_embd), ("n_head", s.n_head),
                                  ("context", s.context)) if v}

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

    def scores(self, weights: np.ndarray, data: np.ndarray, windows: int) -> dict[str, float]:
        """``byte_scores`` where ``data`` holds a window (a peer's held-out text may be shorter: no scores)."""
        return self.byte_scores(weights, data, windows) if len(data) >= self.config().context + 1 else {}

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        return self.scores(weights, validation["bytes"], self.settings.validation_windows) if "bytes" in validation \
            else {}

    def evaluate_local(self, weights: np.ndarray, examples: np.ndarray) -> dict[str, float]:
        """Federated evaluation: the loss on windows of the peer's held-out text."""
        return self.scores(weights, examples, self.settings.local_eval_windows)
