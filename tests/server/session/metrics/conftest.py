"""Fixtures of the metrics sinks' tests: an MLflow store made once per run (MLflow's migrations write a new SQLite
store in several seconds on a busy disk), copied into each test's folder."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from server.session.metrics.mlflow_sink import client
from server.session.metrics.targets import LOCAL_STORE_FILE, local_store


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mlflow-template")
    client(local_store(folder)).search_experiments(max_results=1)  # (creates the tables)
    return folder / LOCAL_STORE_FILE


@pytest.fixture
def mlflow_store(mlflow_template: Path) -> Callable[[Path], str]:
    """``mlflow_store(folder)``: a copy of the empty store as ``folder/mlflow.db`` (where ``--mlflow`` without a URI
    puts it); returns its tracking URI."""
    def copy(folder: Path) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mlflow_template, folder / LOCAL_STORE_FILE)
        return local_store(folder)

    return copy
