"""``simulate --tensorboard DIR --mlflow``: every round of every session in both tools, as ``history.jsonl`` has it,
read back with TensorBoard's and MLflow's own readers; a folder or a store that cannot be used stops the start."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from metrics_readers import (
    assert_float32_equal,
    expected_series,
    history,
    mlflow_run,
    mlflow_series,
    tensorboard_series,
    tensorboard_text,
)

from server import cli

# arith, 6 units of 64 problems, 2 a round (a third of a pass: FedAvgM takes it), one pass: 3 quick rounds
ARITH = ["--task", "arith", "--set", "chunks=6", "--set", "num_examples=384", "--set", "epochs=1", "--set",
         "validation_size=32", "-k", "2", "--passes", "1", "--no-progress"]
SESSIONS = ("fedavg", "fedavgm-m0.5")


def check_sessions(out: Path, tensorboard: Path, tracking_uri: str) -> None:
    for name in SESSIONS:
        expected = expected_series(history(out / name))
        assert {"metrics/val_loss", "diagnostics/spread", "seconds/merge", "train/train_loss"} <= set(expected)
        assert [step for step, _ in expected["metrics/val_loss"]] == [0, 1, 2]
        assert_float32_equal(tensorboard_series(tensorboard / name), expected)
        assert "| config/merge | fedavg" in tensorboard_text(tensorboard / name, "settings")
        run = mlflow_run(tracking_uri, name)
        assert run.info.status == "FINISHED"
        assert mlflow_series(tracking_uri, run.info.run_id) == expected  # (MLflow keeps float64: the same numbers)
        assert run.data.params["task/name"] == "arith" and run.data.params["config/label"] == \
            ("fedavg" if name == "fedavg" else "fedavgm m=0.5")


def test_simulate_writes_each_sessions_rounds_to_tensorboard_and_mlflow(tmp_path: Path,
                                                                      mlflow_store: Callable[[Path], str]) -> None:
    out, tensorboard = tmp_path / "out", tmp_path / "tensorboard"
    tracking_uri = mlflow_store(out)  # (where --mlflow without a URI puts its store: out/mlflow.db)
    arguments = ["simulate", *ARITH, "--merge", "fedavg,fedavgm:server_momentum=0.5", "--workers", "1",
                 "--out", str(out), "--tensorboard", str(tensorboard), "--mlflow"]
    assert cli.main(arguments) == 0
    check_sessions(out, tensorboard, tracking_uri)


def test_sessions_of_a_process_pool_are_written_by_the_driver(tmp_path: Path,
                                                             mlflow_store: Callable[[Path], str]) -> None:
    """On a pool (or Ray) each session's rounds come back with it: the driver writes them, in a new run each."""
    out, tensorboard = tmp_path / "out", tmp_path / "tensorboard"
    tracking_uri = mlflow_store(tmp_path / "store")
    arguments = ["simulate", *ARITH, "--merge", "fedavg,fedavgm:server_momentum=0.5", "--workers", "2",
                 "--out", str(out), "--tensorboard", str(tensorboard), "--mlflow", tracking_uri]
    assert cli.main(arguments) == 0
    check_sessions(out, tensorboard, tracking_uri)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(("option", "words"), [
    (["--tensorboard", "{file}/tensorboard"], "--tensorboard {file}/tensorboard: cannot write there"),
    (["--mlflow", "http://127.0.0.1:{port}"], "--mlflow http://127.0.0.1:{port}: cannot reach the tracking store"),
    (["--mlflow", "runs/mlruns"], "--mlflow runs/mlruns: give a tracking URI"),
])
def test_a_folder_or_store_that_cannot_be_used_stops_the_start(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               option: list[str], words: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    port = free_port()
    filled = [part.format(file=blocker, port=port) for part in option]
    assert cli.main(["simulate", *ARITH, "--out", str(tmp_path / "out"), *filled]) == 2
    assert words.format(file=blocker, port=port) in capsys.readouterr().err
    assert not (tmp_path / "out" / "package").exists()  # refused before anything was built
