"""Finding a task: a built-in name, a file path, or ``package.module[:ClassName]``.

Works the same on the host and in Pyodide (importlib only). A module that fails to import, defines no
task, defines several without saying which, or leaves part of the interface out gets a
:class:`TaskError` that names the problem, before any session starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from runtime.tasks.base import Task, TaskData, TaskError, WorkUnit, check_unit_result

BUILTIN_TASKS = {
    "bytetext": "runtime.tasks.bytetext:ByteTextTask",
    "bytetext-local": "runtime.tasks.bytetext_local:ByteTextLocalTask",
    "arith": "runtime.tasks.arith:ArithTask",
    "cartpole": "runtime.tasks.cartpole:CartPoleTask",
}
REQUIRED_METHODS = ("crosses_boundary", "model_config", "build_model", "prepare", "train_unit", "validate")


def module_name_for_file(path: Path) -> str:
    """The import name a task file gets, on the host and inside the wheel browsers install."""
    return "peertrain_task_" + re.sub(r"\W", "_", path.stem)


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    name = module_name_for_file(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TaskError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise TaskError(f"task file {path} failed to import: {type(error).__name__}: {error}") from error
    return module


def _import_module(dotted: str) -> ModuleType:
    try:
        return importlib.import_module(dotted)
    except Exception as error:
        raise TaskError(f"task module {dotted!r} failed to import: {type(error).__name__}: {error}") from error


def task_class(ref: str) -> type[Task]:
    """Resolve ``ref`` to a Task subclass (see the module docstring for the forms)."""
    ref = BUILTIN_TASKS.get(ref, ref)
    location, _, class_name = ref.partition(":")
    if location.endswith(".py") or "/" in location:
        module = _import_file(Path(location))
    else:
        module = _import_module(location)
    if class_name:
        found = getattr(module, class_name, None)
        if not (inspect.isclass(found) and issubclass(found, Task)):
            raise TaskError(f"{module.__name__} has no Task subclass named {class_name!r}")
        cls: type[Task] = found
    else:
        defined = [obj for obj in vars(module).values()
                   if inspect.isclass(obj) and issubclass(obj, Task) and obj.__module__ == module.__name__]
        if not defined:
            raise TaskError(f"{module.__name__} defines no subclass of runtime.tasks.Task")
        if len(defined) > 1:
            names = sorted(c.__name__ for c in defined)
            raise TaskError(f"{module.__name__} defines several tasks {names}; name one as module:ClassName")
        cls = defined[0]
    missing = [m for m in REQUIRED_METHODS if getattr(cls, m) is getattr(Task, m)]
    if missing:
        raise TaskError(f"task {cls.__name__} ({module.__name__}) does not define {', '.join(missing)}")
    if cls.kind not in ("data", "experience", "local"):
        raise TaskError(f"task {cls.__name__}: kind must be 'data', 'experience' or 'local', not {cls.kind!r}")
    if cls.kind == "local" and cls.parse_local is Task.parse_local:
        raise TaskError(f"task {cls.__name__} ({module.__name__}) is declared kind = 'local' but does not define "
                        "parse_local(name, content): a local task must say how to turn the bytes of a peer's file "
                        "into training examples")
    return cls


def load_task(ref: str, settings: Mapping[str, Any] | None = None) -> Task:
    return task_class(ref)(settings)


def check_task_data(task: Task, data: Any) -> TaskData:
    """Refuse ``prepare`` output that breaks the interface."""
    if not isinstance(data, TaskData):
        raise TaskError(f"task {task.name!r}: prepare returned {type(data).__name__}, expected TaskData")
    if data.num_units <= 0:
        raise TaskError(f"task {task.name!r}: prepare made {data.num_units} work units, need at least 1")
    if task.kind == "data":
        if data.units is None or len(data.units) != data.num_units:
            count = None if data.units is None else len(data.units)
            raise TaskError(f"task {task.name!r}: a data task needs {data.num_units} chunks, got {count}")
        for index, chunk in enumerate(data.units):
            if not isinstance(chunk, np.ndarray) or chunk.dtype != np.int32 or chunk.size == 0:
                raise TaskError(f"task {task.name!r}: chunk {index} must be a non-empty int32 array")
    elif data.units is not None:
        raise TaskError(f"task {task.name!r}: an {task.kind} task's data is not the host's to cut; units must be "
                        "None")
    if task.kind == "local" and task.max_examples_per_unit() is None:
        raise TaskError(f"task {task.name!r}: a local task must define max_examples_per_unit(): the relay cannot "
                        "count a peer's own examples, so it caps what a result may claim")
    return data


def check_example_count(task: Task, unit: WorkUnit, claimed: int) -> None:
    """An honest peer's ``num_examples`` must fit what the relay will count (``Task.unit_examples`` for data
    units, ``Task.max_examples_per_unit`` for experience units), or the relay would refuse its results."""
    if task.kind == "data":
        known = task.unit_examples(unit)
        if claimed > known:
            raise TaskError(f"task {task.name!r}: train_unit reports {claimed} examples for unit {unit.index}, but "
                            f"unit_examples counts {known}; the relay refuses claims above its own count, so define "
                            "unit_examples(unit) to count examples as train_unit does")
    else:  # experience and local units: the peer's count, up to the task's cap
        cap = task.max_examples_per_unit()
        if cap is not None and claimed > cap:
            raise TaskError(f"task {task.name!r}: train_unit reports {claimed} examples, above "
                            f"max_examples_per_unit() = {cap}; the relay would refuse it")


def replayable(task: Task, data: TaskData, *, seed: int = 0) -> bool:
    """Whether training unit 0 twice from the same weights gives the same weights bit for bit: a unit must be a
    function of (weights, unit, settings) alone for the relay to check results by training units again."""
    weights = task.initial_weights(seed)
    first, second = (task.train_unit(weights, task.work_unit(data, 0, seed)).weights for _ in range(2))
    return bool(np.array_equal(first, second))


def dry_run(task: Task, data: TaskData, *, seed: int = 0) -> dict[str, float]:
    """Build the model, train unit 0 once and validate: catches wrong shapes before a session starts. A local task
    trains on its ``sample_local_files`` (if any: the host has no peer's files), and validates only when the host
    holds a validation split (else its sessions are judged by federated evaluation: ``runtime.tasks.local``)."""
    weights = task.initial_weights(seed)
    spec = task.spec()
    if weights.shape != (spec.size,):
        raise TaskError(f"task {task.name!r}: initial weights have shape {weights.shape}, expected ({spec.size},)")
    if task.kind == "local":
        dry_run_local(task, weights, seed)
        if not data.validation:
            return {}
    else:
        unit = task.work_unit(data, 0, seed)
        result = check_unit_result(task, task.train_unit(weights, unit), spec)
        check_example_count(task, unit, int(result.num_examples))
    metrics = task.validate(weights, data.validation)
    if not isinstance(metrics, dict) or task.metric not in metrics:
        raise TaskError(f"task {task.name!r}: validate must return a dict containing {task.metric!r}")
    bad = [k for k, v in metrics.items() if not isinstance(v, int | float) or math.isnan(float(v))]
    if bad:
        raise TaskError(f"task {task.name!r}: validate returned non-numeric or NaN metrics {bad}")
    return metrics



def dry_run_local(task: Task, weights: np.ndarray, seed: int) -> None:
    """A local task's sample files parsed and one unit trained on them, as a peer would (``train_local_unit``)."""
    from runtime.tasks.local import LocalData, train_local_unit

    samples = task.sample_local_files()
    if not samples:
        return
    local = LocalData(task)
    refused = [report.error for report in (local.add(name, content) for name, content in samples) if report.error]
    if refused:
        raise TaskError(f"task {task.name!r}: parse_local refused its own sample_local_files: {refused[0]}")
    unit = local.work_unit(0, seed)
    result = train_local_unit(task, weights, unit)
    check_example_count(task, unit, int(result.num_examples))
