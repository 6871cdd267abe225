"""A session's runs across a restart and a ban's undo: the resumed relay writes on in the same MLflow run and the same
TensorBoard run without a step twice; rounds merged again after an undo are marked ``undone`` and replace the old
ones in TensorBoard's readers (MLflow keeps both, the new ones last)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from metrics_readers import (
    Series,
    assert_float32_equal,
    expected_series,
    history,
    mlflow_run,
    mlflow_series,
    tensorboard_series,
)

from server.session.metrics import MetricsTargets
from server.session.package import Package
from server.session.session import Session, SessionConfig
from server.simulation.simulator import run_round

CONFIG = SessionConfig(participants=2, passes=2, keep_checkpoints=8)  # 4 rounds of the majority example's 4 units


def test_a_resumed_session_writes_on_in_the_same_runs_without_a_step_twice(package: Package, tmp_path: Path,
                                                                           mlflow_store: Callable[[Path], str]) -> None:
    session_dir = tmp_path / "session"
    targets = MetricsTargets(tensorboard=tmp_path / "tensorboard", mlflow=mlflow_store(tmp_path / "store"))
    log = targets.log()
    session = Session.create(package, CONFIG, directory=session_dir, round_log=log)
    run_round(session)
    run_round(session)
    log.close()  # the relay stops (or is killed) between rounds
    assert mlflow_run(targets.mlflow or "", "session").info.status == "KILLED"

    log = targets.log()
    session = Session.restore(session_dir, package, round_log=log)
    while not session.done:
        run_round(session)
    log.close()
    expected = expected_series(history(session_dir))
    assert [step for step, _ in expected["metrics/accuracy"]] == [0, 1, 2, 3]
    assert_float32_equal(tensorboard_series(targets.tensorboard / "session"), expected)  # type: ignore[operator]
    run = mlflow_run(targets.mlflow or "", "session")  # (one run: the same one, RUNNING again, then FINISHED)
    assert run.info.status == "FINISHED"
    assert mlflow_series(targets.mlflow or "", run.info.run_id) == expected


def latest(series: Series) -> Series:
    """Each step's last value (MLflow keeps every value logged at a step, in the order logged)."""
    return {key: sorted(dict(points).items()) for key, points in series.items()}


def test_rounds_an_undo_merges_again_are_marked_and_replace_the_old_ones(package: Package, tmp_path: Path,
                                                                         mlflow_store: Callable[[Path], str]) -> None:
    session_dir = tmp_path / "session"
    targets = MetricsTargets(tensorboard=tmp_path / "tensorboard", mlflow=mlflow_store(tmp_path / "store"))
    log = targets.log()
    session = Session.create(package, CONFIG, directory=session_dir, round_log=log)
    for _ in range(3):
        run_round(session)
    assert log.flush()
    before = expected_series(history(session_dir))
    session.rewind(1)  # a ban's undo (server.relay.undo): back to the checkpoint after round 1, then merged again
    while not session.done:  # (without the banned peer's result: slot 1's)
        assignment = session.assignments()[0]
        session.complete_round([(assignment, session.task.train_unit(session.weights, session.work_unit(assignment)))])
    log.close()
    expected = expected_series(history(session_dir))
    assert expected["participants"] == [(0, 2.0), (1, 1.0), (2, 1.0), (3, 1.0)]

    shown = tensorboard_series(targets.tensorboard / "session")  # type: ignore[operator]
    assert shown.pop("undone") == [(1, 2.0)]  # rounds 1 and 2 were set aside
    assert_float32_equal(shown, expected)

    series = mlflow_series(targets.mlflow or "", mlflow_run(targets.mlflow or "", "session").info.run_id)
    assert series.pop("undone") == [(1, 2.0)]
    newest = latest(series)
    for key, points in expected.items():
        assert [point for point in newest[key] if point[0] in dict(points)] == points, key
    # MLflow cannot delete a point: a number the new rounds lack (their cosine with the undone round before them)
    # keeps the undone rounds' value; only there
    stale = {step for key, points in newest.items() for step, _ in points if step not in dict(expected.get(key, []))}
    assert stale <= {1, 2}
    assert series["participants"] == [(0, 2.0), (1, 2.0), (1, 1.0), (2, 2.0), (2, 1.0), (3, 1.0)]
    assert before["participants"] == [(0, 2.0), (1, 2.0), (2, 2.0)]
