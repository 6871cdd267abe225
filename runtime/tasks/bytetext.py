"""Byte-level language modelling: any text, or by default CPython's own ``pydoc_data.topics``.

The transformer LM task's byte-level form (``runtime.tasks.lm_task.ByteLMTask``: the model, the local recipe,
training, validation and samples) on bytes the host holds: it cuts them into C chunks (55 by default) and holds
out an interleaved 10% for validation (see ``runtime.data.text``). A peer trains ``bytelm-2.3mb`` on random windows
of its chunk. Metric: validation loss in nats per byte, and bits per byte; samples: text generated from a few
prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runtime.data.text import byte_chunks, default_corpus
from runtime.tasks.base import HostServices, TaskData, TaskError, WorkUnit
from runtime.tasks.lm_task import ByteLMTask, ByteSettings
from runtime.tasks.settings import setting


@dataclass(frozen=True, kw_only=True)
class ByteTextSettings(ByteSettings):
    """The recipe (``runtime.tasks.lm_recipe.LMRecipe``, its defaults the ones tuned here) and where the bytes come
    from and how they are judged."""

    files: tuple[str, ...] = field(default=(), metadata=setting(help="text files; empty: the built-in pydoc corpus"))
    chunks: int = field(default=55, metadata=setting(help="work units the corpus is cut into", minimum=1))
    validation_fraction: float = field(default=0.1, metadata=setting(
        help="the share of the corpus held out (interleaved) for validation (runtime.data.text.byte_chunks)"))
    data_seed: int = field(default=0, metadata=setting(help="seeds the cut into chunks and the held-out share"))
    validation_windows: int = field(default=256, metadata=setting(help="evenly spaced windows validation scores"))
    report_half: bool = field(default=False, metadata=setting(
        help="hold out every other validation window as a report split: val_loss (what the session selects its best "
        "round on, and a study its settings on) comes from the others, report_loss from these"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))
        super().__post_init__()


class ByteTextTask(ByteLMTask):
    name = "bytetext"
    kind = "data"
    metric = "val_loss"
    Settings = ByteTextSettings
    settings: ByteTextSettings
    missing_data = "a unit needs its chunk of bytes"
    # Adam divides each gradient by its running magnitude, so on coordinates whose gradients are nearly zero
    # (bytes a chunk hardly uses) the last-bit differences between the browser's SIMD matmul and native BLAS
    # become whole steps. Measured in headless Chromium: a browser unit differed from its native replay by up
    # to 40% of its update (62 units), so a replay cannot judge a bytetext result; the other checks remain.
    replay_across_engines = False
    # Results and merged steps as topk at 10 % with error feedback (``peertrain bench comm``, 3 seeds, k = 5, 33
    # rounds: 18x fewer bytes each way, final validation loss 0.6 % *below* float32's; int8: 3.9x at +0.6 %; topk at
    # 3 %: 50x at +1.7 %, past the 1 % a default may cost; BENCHMARKS.md, "Result codecs"). Where host replays or
    # copies compare results the session takes int8 instead (a topk result carries its peer's residual).
    default_codec = "topk"

    def crosses_boundary(self) -> str:
        source = ", ".join(self.settings.files) or "CPython's pydoc topics (public documentation)"
        return (f"Peers receive one chunk of raw text bytes from {source} per assignment (about 1/"
                f"{self.settings.chunks} of it) and the model weights; the validation split stays on the host.")

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

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        return self.byte_scores(weights, validation["bytes"], self.settings.validation_windows,
                                report_half=self.settings.report_half)
