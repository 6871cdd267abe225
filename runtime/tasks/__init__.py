"""Tasks: the task interface, the built-in tasks and the loader for custom task modules."""

from __future__ import annotations

from runtime.tasks.base import HostServices, Sample, Task, TaskData, TaskError, UnitResult, WorkUnit
from runtime.tasks.loader import BUILTIN_TASKS, load_task, task_class

__all__ = [
    "BUILTIN_TASKS",
    "HostServices",
    "Sample",
    "Task",
    "TaskData",
    "TaskError",
    "UnitResult",
    "WorkUnit",
    "load_task",
    "task_class",
]
