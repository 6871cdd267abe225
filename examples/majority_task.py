"""A complete custom task: learn whether most of 8 bits are set, with a small MLP.

    peertrain package  --task examples/majority_task.py --out runs/majority
    peertrain simulate --task examples/majority_task.py --merge fedavg -k 2 --passes 3
    peertrain serve    --task examples/majority_task.py
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.autograd import functional, no_grad
from runtime.models.mlp import MLPConfig, MLPPolicy
from runtime.optim import Adam
from runtime.tasks import Sample, Task, TaskData, UnitResult, WorkUnit

BITS = 8


@dataclass(frozen=True)
class MajoritySettings:
    examples: int = 4096  # rows of random bits the host generates
    chunks: int = 8  # work units per pass
    hidden: int = 32
    epochs: int = 5  # local passes over a chunk per unit
    lr: float = 0.01
    data_seed: int = 0


class MajorityTask(Task):
    name = "majority"
    kind = "data"  # units are chunks of data the host cuts
    metric = "val_loss"
    Settings = MajoritySettings

    def crosses_boundary(self) -> str:
        return "Peers receive random bit strings with their majority label (synthetic data) and the weights."

    def model_config(self) -> dict:
        return MLPConfig(sizes=(BITS, self.settings.hidden, 2)).to_dict()

    def build_model(self, seed: int) -> MLPPolicy:
        return MLPPolicy(MLPConfig(sizes=(BITS, self.settings.hidden, 2)), seed)

    def prepare(self, host=None) -> TaskData:
        rng = np.random.default_rng(self.settings.data_seed)
        bits = rng.integers(0, 2, size=(self.settings.examples + 512, BITS), dtype=np.int32)
        labels = bits.sum(axis=1, keepdims=True) > BITS // 2  # (N, 1)
        rows = np.concatenate([bits, labels], axis=1).astype(np.int32)  # (N, 9)
        train, held_out = rows[:-512], rows[-512:]
        chunks = [chunk.ravel() for chunk in np.array_split(train, self.settings.chunks)]  # int32, flat
        return TaskData(num_units=len(chunks), units=chunks, validation={"rows": held_out})

    def unit_examples(self, unit: WorkUnit) -> int:
        """Chunks are stored flat: 9 numbers a row. The relay weighs a result by this count, not the peer's."""
        return unit.data.size // (BITS + 1)

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        model = self.load(weights)  # the task's model, holding the global weights
        rows = unit.data.reshape(-1, BITS + 1)
        optimizer = Adam(model.parameters(), lr=self.settings.lr)
        rng = np.random.default_rng(unit.seed)  # the same seed replays the same unit exactly
        for _ in range(self.settings.epochs):
            for batch in np.array_split(rng.permutation(len(rows)), 4):
                loss = functional.cross_entropy(model(rows[batch, :BITS].astype(np.float32)), rows[batch, BITS])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return UnitResult(self.flat_weights(model), num_examples=len(rows), metrics={"train_loss": loss.item()})

    def validate(self, weights: np.ndarray, validation: dict) -> dict[str, float]:
        model = self.load(weights)
        rows = validation["rows"]
        with no_grad():
            logits = model(rows[:, :BITS].astype(np.float32))
            loss = functional.cross_entropy(logits, rows[:, BITS]).item()
        accuracy = float((logits.numpy().argmax(axis=1) == rows[:, BITS]).mean())
        return {"val_loss": loss, "accuracy": accuracy}

    def samples(self, weights: np.ndarray, validation: dict, count: int = 4) -> list[Sample]:
        model = self.load(weights)
        rows = validation["rows"][:count]
        with no_grad():
            guesses = model(rows[:, :BITS].astype(np.float32)).numpy().argmax(axis=1)
        return [Sample(f"{''.join(map(str, row[:BITS]))} -> {guess}", ok=bool(guess == row[BITS]))
                for row, guess in zip(rows, guesses, strict=True)]
