"""What a session wrote to TensorBoard and MLflow, read back with the tools' own readers, and what its history says
they should hold (an oracle of its own: every finite number of an entry, nested keys joined by ``/``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from server.session.metrics.mlflow_sink import client

Series = dict[str, list[tuple[int, float]]]  # key -> [(step, value)] in the order written


def history(session_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session_dir / "history.jsonl").read_text().splitlines() if line.strip()]


def expected_series(entries: list[dict[str, Any]]) -> Series:
    """Every finite number of every entry but its round and time, by ``/``-joined key, at step = round."""
    series: Series = {}

    def walk(value: Any, path: list[str], step: int) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, [*path, key], step)
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            series.setdefault("/".join(path), []).append((step, float(value)))

    for entry in entries:
        walk({k: v for k, v in entry.items() if k not in ("round", "time")}, [], entry["round"])
    return series


def tensorboard_series(run_dir: Path) -> Series:
    """Every scalar series of a run as TensorBoard's own reader gives it (restarts applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def tensorboard_text(run_dir: Path, tag: str) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    accumulator.Reload()
    (event,) = accumulator.Tensors(f"{tag}/text_summary")
    return b"".join(event.tensor_proto.string_val).decode()


def mlflow_run(tracking_uri: str, name: str) -> Any:
    """The one run named ``name`` in the store."""
    mlflow = client(tracking_uri)
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    runs = [run for run in mlflow.search_runs(experiments) if run.info.run_name == name]
    assert len(runs) == 1, [run.info.run_name for run in runs]
    return runs[0]


def mlflow_series(tracking_uri: str, run_id: str) -> Series:
    mlflow = client(tracking_uri)
    keys = mlflow.get_run(run_id).data.metrics
    return {key: [(m.step, m.value) for m in sorted(mlflow.get_metric_history(run_id, key),
                                                      key=lambda m: (m.step, m.timestamp))] for key in keys}


def assert_float32_equal(actual: Series, expected: Series) -> None:
    """The same keys, steps and values, TensorBoard's as float32."""
    assert sorted(actual) == sorted(expected)
    for key, points in expected.items():
        assert [step for step, _ in actual[key]] == [step for step, _ in points], key
        np.testing.assert_array_equal(np.float32([v for _, v in actual[key]]), np.float32([v for _, v in points]),
                                      err_msg=key)
