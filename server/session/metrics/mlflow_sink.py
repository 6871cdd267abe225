"""A session's run in MLflow, through mlflow-skinny's ``MlflowClient`` (no global active run: several sessions of a
sweep each have their own).

One run per session, named after its folder, in the experiment ``peertrain TASK``; its params are the session's
settings (truncated to MLflow's limits), its metrics every round's numbers at step = round, at the round's own wall
time. The run's id is kept in the session folder (``metrics_log.json``), so a resumed session writes on in the same
run (RUNNING again); the session's end marks it FINISHED, its process stopping before that KILLED.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from server.session.metrics import entries

EXPERIMENT_PREFIX = "peertrain "  # + the task's name
# MLflow's own limits (mlflow.utils.validation): a batch holds 100 params or 1000 metrics, a param's value 6000
# characters, a key 250.
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
PARAM_VALUE_LENGTH = 6000
KEY_LENGTH = 250
TRUNCATED = "..."
# A tracking server that is down costs a round's write a few seconds here, not MLflow's default of seven retries with
# back-off and two-minute timeouts (about four minutes); the round is written again at the next one. The start-up
# check answers as fast. A value the user set in the environment wins.
HTTP_ENVIRONMENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` of ``tracking_uri``, its HTTP retries bounded (``HTTP_ENVIRONMENT``)."""
    for name, value in HTTP_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


class MLflowSink:
    """``tracking_uri``: the store or server; ``run_name``: the session's folder name."""

    kind = "mlflow"

    def __init__(self, tracking_uri: str, run_name: str) -> None:
        self.tracking_uri, self.run_name = tracking_uri, run_name
        self.run_id: str | None = None
        self._client: Any = None

    def open(self, saved: Mapping[str, Any] | None, settings: Mapping[str, str]) -> bool:
        """Write on in the run ``saved`` names when it is in this store and still there (True); else a new run with
        the settings as its params."""
        self._client = client(self.tracking_uri)
        if saved is not None and saved.get("tracking_uri") == self.tracking_uri and saved.get("run_id"):
            from mlflow.exceptions import MlflowException

            try:
                run = self._client.get_run(saved["run_id"])
            except MlflowException:  # (deleted from the store meanwhile: a new run)
                run = None
            if run is not None and run.info.lifecycle_stage == "active":
                self.run_id = run.info.run_id
                if run.info.status != "RUNNING":
                    self._client.update_run(self.run_id, status="RUNNING")
                return True
        experiment = EXPERIMENT_PREFIX + settings.get("task/name", "session")
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self._client.create_experiment(experiment)
        run = self._client.create_run(experiment_id, run_name=self.run_name,
                                      tags={"mlflow.source.name": "peertrain", "peertrain.session": self.run_name})
        self.run_id = run.info.run_id
        self._log_params(settings)
        return False

    def _log_params(self, settings: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        params = [Param(key[:KEY_LENGTH], short(value)) for key, value in sorted(settings.items())]
        for batch in batches(params, PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=batch)

    def state(self) -> dict[str, Any]:
        return {"tracking_uri": self.tracking_uri, "run_id": self.run_id}

    def write(self, entry: Mapping[str, Any]) -> None:
        self._log_metrics(entries.scalars(entry), entries.step(entry), entries.wall_time(entry))

    def undo(self, step: int, rounds: int) -> None:
        self._log_metrics({entries.UNDONE: float(rounds)}, step, time.time())

    def _log_metrics(self, values: Mapping[str, float], step: int, wall_time: float) -> None:
        from mlflow.entities import Metric

        milliseconds = int(wall_time * 1000)
        metrics = [Metric(key[:KEY_LENGTH], value, milliseconds, step) for key, value in values.items()]
        for batch in batches(metrics, METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=batch)

    def end(self, *, finished: bool, stopped: str | None) -> None:
        if stopped:
            self._client.set_tag(self.run_id, "peertrain.stopped", short(stopped))
        self._client.set_terminated(self.run_id, status="FINISHED" if finished else "KILLED")

    def close(self) -> None:
        self._client = None


def short(value: str) -> str:
    """``value`` cut to what an MLflow param or tag holds, marked where cut."""
    if len(value) <= PARAM_VALUE_LENGTH:
        return value
    return value[:PARAM_VALUE_LENGTH - len(TRUNCATED)] + TRUNCATED


def batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[start:start + size] for start in range(0, len(items), size)]
