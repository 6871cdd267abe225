"""A complete local task: classify the rows of CSV files that each volunteer chooses in the page, with a small MLP.

The rows never leave the volunteers' browsers: each peer trains on its own files and sends back weights, with
the metrics of the weights it was handed on a held-out fifth of its rows (federated evaluation). The host may
validate on a CSV of its own (``validation_file``); without one the session is judged by federated evaluation.

    python examples/make_local_data.py csv --out examples/data/csv       # sample files (already in the repo)
    peertrain simulate --task examples/csv_task.py --set validation_file=examples/data/csv/validation.csv \\
        --local-data examples/data/csv/peers -k 3 --passes 4
    peertrain serve    --task examples/csv_task.py --set validation_file=examples/data/csv/validation.csv
    peertrain peers 3  --local-data examples/data/csv/peers      # or open the page and choose your own files
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtime.autograd import functional, no_grad
from runtime.models.mlp import MLPConfig, MLPPolicy
from runtime.optim import Adam
from runtime.tasks import Sample, Task, TaskData, TaskError, UnitResult, WorkUnit
from runtime.tasks.base import batches
from runtime.tasks.local import LocalDataError, decode_text


@dataclass(frozen=True)
class CsvSettings:
    features: tuple[str, ...] = ("x1", "x2", "x3", "x4")  # the feature columns, by their header names
    label: str = "label"  # the label column: integers 0 .. classes-1
    classes: int = 3
    delimiter: str = ","
    hidden: int = 16
    epochs: int = 2  # local passes over the (capped) rows per unit
    batch_size: int = 32
    lr: float = 0.005
    units: int = 6  # work units per pass: each is "train on your rows" for one peer
    max_rows_per_unit: int = 5000  # a unit trains on at most this many of a peer's rows (a seeded sample)
    validation_file: str = ""  # a CSV on the host to validate on; empty: federated evaluation only

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        if not self.features or self.classes < 2 or self.max_rows_per_unit < 1 or self.units < 1:
            raise ValueError("need at least one feature, two classes, one unit and one row per unit")


class CsvTask(Task):
    name = "csv"
    kind = "local"  # peers train on their own files, chosen in the page
    metric = "val_loss"
    plot_metric = "accuracy"
    local_accept = ".csv,text/csv"
    respond_hint = "0.5, 1.0, -0.3, 0.8"
    Settings = CsvSettings
    settings: CsvSettings

    @property
    def local_hint(self) -> str:  # type: ignore[override]
        s = self.settings
        return (f"CSV files with a header row naming the columns {', '.join(s.features)} (numbers) and {s.label} "
                f"(a class 0-{s.classes - 1})")

    def crosses_boundary(self) -> str:
        host = f" The host validates on its own file {Path(self.settings.validation_file).name}." \
            if self.settings.validation_file else ""
        return ("Only the weights: each peer trains on CSV files it chooses in its own page, and their rows stay in "
                "its browser. Peers send back trained weights and the metrics of the weights they were handed on a "
                "held-out fifth of their own rows." + host)

    def sizes(self) -> tuple[int, ...]:
        return (len(self.settings.features), self.settings.hidden, self.settings.classes)

    def model_config(self) -> dict:
        return MLPConfig(sizes=self.sizes()).to_dict()

    def build_model(self, seed: int) -> MLPPolicy:
        return MLPPolicy(MLPConfig(sizes=self.sizes()), seed)

    def prepare(self, host=None) -> TaskData:
        validation = {}
        if self.settings.validation_file:
            path = Path(self.settings.validation_file)
            try:
                validation = {"rows": self.parse_local(path.name, path.read_bytes())}
            except OSError as error:
                raise TaskError(f"csv: cannot read the validation file {path}: {error.strerror}") from error
        return TaskData(num_units=self.settings.units, validation=validation)

    def max_examples_per_unit(self) -> int:
        """The relay counts a peer's rows up to this cap (it cannot see them)."""
        return self.settings.max_rows_per_unit

    def parse_local(self, name: str, content: bytes) -> np.ndarray:
        """The rows of one CSV file as float32 (N, features + 1), the label last; errors name the file and line."""
        s = self.settings
        reader = csv.reader(io.StringIO(decode_text(name, content), newline=""), delimiter=s.delimiter)
        header = next((row for row in reader if any(cell.strip() for cell in row)), None)
        if header is None:
            raise LocalDataError(name, "the file holds no rows")
        header_line, header = reader.line_num, [cell.strip() for cell in header]
        missing = [column for column in (*s.features, s.label) if column not in header]
        if missing:
            raise LocalDataError(name, f"the header has no column {missing[0]!r} (it has {', '.join(header)})",
                                 header_line)
        columns = [header.index(column) for column in (*s.features, s.label)]
        rows = []
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise LocalDataError(name, f"{len(row)} columns, the header has {len(header)}", reader.line_num)
            values = [self.number(name, reader.line_num, header[i], row[i]) for i in columns]
            if not (values[-1].is_integer() and 0 <= values[-1] < s.classes):
                raise LocalDataError(name, f"{s.label} {row[columns[-1]].strip()!r} is not a class 0-{s.classes - 1}",
                                     reader.line_num)
            rows.append(values)
        if not rows:
            raise LocalDataError(name, "no data rows after the header", header_line)
        return np.array(rows, dtype=np.float32)

    @staticmethod
    def number(name: str, line: int, column: str, cell: str) -> float:
        try:
            value = float(cell)
        except ValueError:
            raise LocalDataError(name, f"column {column!r}: {cell.strip()!r} is not a number", line) from None
        if not math.isfinite(value):
            raise LocalDataError(name, f"column {column!r}: {cell.strip()!r} is not a finite number", line)
        return value

    def sample_local_files(self) -> list[tuple[str, bytes]]:
        """A made-up file, so that `peertrain package` can train one unit on the host."""
        s = self.settings
        lines = [s.delimiter.join((*s.features, s.label))]
        lines += [s.delimiter.join([f"{(i * (j + 3)) % 7 / 7:.3f}" for j in range(len(s.features))]
                                   + [str(i % s.classes)]) for i in range(12)]
        return [("sample.csv", "\n".join(lines).encode())]

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        rows = unit.data  # this peer's training rows (its own files, minus the held-out share)
        rng = np.random.default_rng(unit.seed)  # the same seed and rows train the same unit exactly
        if len(rows) > self.settings.max_rows_per_unit:
            rows = rows[np.sort(rng.choice(len(rows), self.settings.max_rows_per_unit, replace=False))]
        features, labels = rows[:, :-1], rows[:, -1].astype(np.int32)
        model = self.load(weights)
        optimizer = Adam(model.parameters(), lr=self.settings.lr)
        for _ in range(self.settings.epochs):
            for batch in batches(len(rows), self.settings.batch_size, rng):
                loss = functional.cross_entropy(model(features[batch]), labels[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return UnitResult(self.flat_weights(model), num_examples=len(rows), metrics={"train_loss": loss.item()})

    def scores(self, weights: np.ndarray, rows: np.ndarray) -> dict[str, float]:
        model = self.load(weights)
        labels = rows[:, -1].astype(np.int32)
        with no_grad():
            logits = model(rows[:, :-1])
            loss = functional.cross_entropy(logits, labels).item()
        return {"val_loss": loss, "accuracy": float((logits.numpy().argmax(axis=1) == labels).mean())}

    def validate(self, weights: np.ndarray, validation: dict) -> dict[str, float]:
        return self.scores(weights, validation["rows"]) if "rows" in validation else {}

    def evaluate_local(self, weights: np.ndarray, examples: np.ndarray) -> dict[str, float]:
        """Federated evaluation: the same metrics on a peer's held-out rows."""
        return self.scores(weights, examples)

    def samples(self, weights: np.ndarray, validation: dict, count: int = 4) -> list[Sample]:
        if "rows" not in validation:
            return []
        rows = validation["rows"][:count]
        with no_grad():
            guesses = self.load(weights)(rows[:, :-1]).numpy().argmax(axis=1)
        return [Sample(f"{', '.join(f'{v:.2f}' for v in row[:-1])} -> class {guess} (label {int(row[-1])})",
                       ok=bool(guess == int(row[-1]))) for row, guess in zip(rows, guesses, strict=True)]

    def respond(self, weights: np.ndarray, prompt: str) -> dict:
        try:
            values = [float(v) for v in prompt.replace(",", " ").split()]
        except ValueError:
            values = []
        if len(values) != len(self.settings.features):
            raise TaskError(f"give {len(self.settings.features)} numbers ({', '.join(self.settings.features)})")
        with no_grad():
            logits = self.load(weights)(np.array([values], dtype=np.float32)).numpy()[0]
        odds = np.exp(logits - logits.max())
        odds /= odds.sum()
        return {"text": f"class {int(odds.argmax())} (p = {odds.max():.2f})"}
