"""Is a point inside the circle? The README's task: `peertrain serve --task examples/circle_task.py`."""

from dataclasses import dataclass

import numpy as np

from runtime.autograd import functional, no_grad
from runtime.models.mlp import MLPConfig, MLPPolicy
from runtime.optim import Adam
from runtime.tasks import Task, TaskData, UnitResult


@dataclass(frozen=True)
class CircleSettings:
    chunks: int = 6  # work units per pass
    epochs: int = 10  # passes over a chunk per unit
    lr: float = 0.05


class CircleTask(Task):
    name, kind, metric, higher_is_better, Settings = "circle", "data", "accuracy", True, CircleSettings

    def crosses_boundary(self) -> str:
        return "Peers receive random points (synthetic data), whether each is inside the circle, and the weights."

    def model_config(self) -> dict:
        return MLPConfig(sizes=(2, 16, 2)).to_dict()

    def build_model(self, seed: int) -> MLPPolicy:
        return MLPPolicy(MLPConfig(sizes=(2, 16, 2)), seed)

    def prepare(self, host=None) -> TaskData:
        points = np.random.default_rng(0).integers(-10, 11, size=(3500, 2))
        rows = np.column_stack([points, (points**2).sum(axis=1) < 50]).astype(np.int32)  # x, y, inside
        chunks = np.array_split(rows[:3000], self.settings.chunks)
        return TaskData(num_units=len(chunks), units=chunks, validation={"rows": rows[3000:]})

    def train_unit(self, weights: np.ndarray, unit) -> UnitResult:
        model, rows = self.load(weights), unit.data
        optimizer = Adam(model.parameters(), lr=self.settings.lr)
        rng = np.random.default_rng(unit.seed)  # the same seed trains the same unit: a replay checks it
        for batch in (b for _ in range(self.settings.epochs) for b in np.array_split(rng.permutation(len(rows)), 10)):
            loss = functional.cross_entropy(model(rows[batch, :2] / 10.0), rows[batch, 2])
            optimizer.zero_grad(), loss.backward(), optimizer.step()
        return UnitResult(self.flat_weights(model), num_examples=len(rows), metrics={"train_loss": loss.item()})

    def validate(self, weights: np.ndarray, validation: dict) -> dict[str, float]:
        with no_grad():
            guesses = self.load(weights)(validation["rows"][:, :2] / 10.0).numpy().argmax(axis=1)
        return {"accuracy": float((guesses == validation["rows"][:, 2]).mean())}
