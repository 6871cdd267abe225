"""Local tasks: each peer trains on files it chose itself, and only weights (and held-out metrics) leave it.

A task of ``kind = "local"`` says how to read one of a peer's files (``Task.parse_local(name, content) ->
examples``) and how to train on the examples (``train_unit``, whose ``unit.data`` holds them). In the page the
files are read with the File API and handed to the worker as bytes; :class:`LocalData` (held by
``runtime.peer.Peer``) parses each one, keeps a per-file report (examples found, or the reason it was refused:
:class:`LocalDataError` names the file and the line), joins the valid files' examples in file-name order and
splits them once into training and a seeded held-out share (``Task.split_local``), so a peer holds out the same
examples every round, and the simulator the same as a browser given the same files.

A unit is "train on your local data" with the round's weights and a seed. :func:`train_local_unit` trains it and
adds federated evaluation: the task's metrics (``Task.evaluate_local``) of the weights the unit started from, on
the held-out examples, reported in the result's metrics as ``federated_<name>`` with ``federated_examples`` (how
many held-out examples they cover). The example count a peer reports is its own, at most
``Task.max_examples_per_unit`` (the relay refuses a claim above it, and cannot check it further: a local unit
cannot be replayed by the host, nor compared with another peer's, whose data differs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.tasks.base import Task, TaskError, UnitResult, WorkUnit, check_unit_result

FEDERATED_PREFIX = "federated_"
FEDERATED_EXAMPLES = FEDERATED_PREFIX + "examples"


class LocalDataError(TaskError):
    """A peer's file that a local task cannot read; the message names the file and, where known, the line."""

    def __init__(self, file: str, reason: str, line: int | None = None) -> None:
        self.file, self.reason, self.line = file, reason, line
        super().__init__(f"{file}, line {line}: {reason}" if line is not None else f"{file}: {reason}")


def decode_text(name: str, content: bytes, *, encoding: str = "utf-8") -> str:
    """``content`` as text, or a ``LocalDataError`` naming the line of the first undecodable byte, or saying that
    the file is empty (a byte-order mark is dropped)."""
    if not content.strip():
        raise LocalDataError(name, "the file is empty" if not content else "the file holds only blank space")
    try:
        text = content.decode(encoding)
    except UnicodeDecodeError as error:
        line = content[:error.start].count(b"\n") + 1
        raise LocalDataError(name, f"not {encoding.upper()} text (byte 0x{content[error.start]:02x} cannot be "
                             f"decoded)", line) from error
    return text.removeprefix("\ufeff")


@dataclass(frozen=True)
class LocalFile:
    """What became of one file: its size, the examples it gave, or why it was refused."""

    name: str
    size: int
    examples: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class LocalData:
    """A peer's own files, parsed by its task; see the module docstring."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self._arrays: dict[str, np.ndarray] = {}
        self._reports: dict[str, LocalFile] = {}
        self._split: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, name: str, content: bytes) -> LocalFile:
        """Parse one file (a file of the same name is replaced); returns its report."""
        self._arrays.pop(name, None)
        self._split = None
        try:
            examples = self.task.parse_local(name, bytes(content))
            if not isinstance(examples, np.ndarray) or examples.ndim == 0 or examples.shape[0] == 0:
                raise LocalDataError(name, "no examples found in it")
        except LocalDataError as error:
            report = LocalFile(name, len(content), error=str(error))
        except Exception as error:  # a task's own parsing bug: the file is refused, the page says why
            report = LocalFile(name, len(content), error=f"{name}: {type(error).__name__}: {error}")
        else:
            self._arrays[name] = examples
            report = LocalFile(name, len(content), examples=int(examples.shape[0]))
        self._reports[name] = report
        return report

    def clear(self) -> None:
        self._arrays.clear()
        self._reports.clear()
        self._split = None

    @property
    def files(self) -> list[LocalFile]:
        return [self._reports[name] for name in sorted(self._reports)]

    def examples(self) -> np.ndarray | None:
        """Every valid file's examples, joined in file-name order (None: no valid file)."""
        if not self._arrays:
            return None
        return self.task.combine_local([self._arrays[name] for name in sorted(self._arrays)])

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(training, held-out) examples, computed once per set of files."""
        if self._split is None:
            examples = self.examples()
            if examples is None:
                raise TaskError("no local data: choose at least one file the task can read")
            self._split = self.task.split_local(examples)
        return self._split

    def ready(self) -> bool:
        """Whether there are enough training examples to train a unit."""
        return self.examples() is not None and len(self.split()[0]) >= self.task.min_local_examples()

    def summary(self) -> dict[str, Any]:
        """The page's summary: every file's report, the examples found, how they split, and whether it may train."""
        train, held = self.split() if self._arrays else (None, None)
        needed = self.task.min_local_examples()
        return {"files": [f.to_json() for f in self.files], "valid_files": len(self._arrays),
                "examples": sum(f.examples for f in self.files), "train": 0 if train is None else len(train),
                "held_out": 0 if held is None else len(held), "needed": needed,
                "ready": train is not None and len(train) >= needed}

    def work_unit(self, index: int, seed: int, progress: float = 0.0) -> WorkUnit:
        """The unit a local job trains: this peer's training examples and its held-out share."""
        train, held = self.split()
        needed = self.task.min_local_examples()
        if len(train) < needed:
            raise TaskError(f"the local data holds {len(train)} training examples; {self.task.name} needs {needed}")
        return WorkUnit(index=index, seed=seed, data=train, held_out=held, progress=progress)


def federated_metrics(task: Task, weights: np.ndarray, held_out: np.ndarray | None) -> dict[str, float]:
    """``federated_<name>`` for each of the task's metrics of ``weights`` on ``held_out``, with
    ``federated_examples``; empty without held-out examples."""
    if held_out is None or len(held_out) == 0:
        return {}
    scores = task.evaluate_local(weights, held_out)
    if not scores:
        return {}
    return {FEDERATED_PREFIX + name: float(value) for name, value in scores.items()} | \
        {FEDERATED_EXAMPLES: float(len(held_out))}


def train_local_unit(task: Task, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
    """Train a local unit (its ``data`` the peer's examples) and add the federated evaluation of ``weights`` (the
    round's, before training) on ``unit.held_out``; the count is checked against the task's cap."""
    federated = federated_metrics(task, weights, unit.held_out)
    result = check_unit_result(task, task.train_unit(weights, unit), task.spec())
    cap = task.max_examples_per_unit()
    if cap is not None and int(result.num_examples) > cap:
        raise TaskError(f"task {task.name!r}: train_unit reports {result.num_examples} examples, above "
                        f"max_examples_per_unit() = {cap}; count at most the cap (train on a sample of that size)")
    return UnitResult(result.weights, int(result.num_examples), {**result.metrics, **federated})
