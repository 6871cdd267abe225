"""The round loop: plan bookkeeping, history, checkpoints (bit-exact resume), divergence watch, merge guard."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import build_text_package

from runtime.merge import FedAvgM
from runtime.planner import MergeGuardRefused
from runtime.tasks import Task, TaskData, UnitResult, WorkUnit
from runtime.weights import WeightSpec
from server.session import checkpoint_files as checkpoint
from server.session.package import Package
from server.session.session import Session, SessionConfig, SessionError, split_server_state
from server.simulation.simulator import run_round

TARGET = np.array([1.0, -2.0, 0.5, 3.0])


class ToyTask(Task):
    """Four weights pulled halfway towards their chunk's value per unit; val_loss = squared distance to TARGET."""

    name = "toy"
    metric = "val_loss"

    def spec(self) -> WeightSpec:
        return WeightSpec((("w", (4,)),))

    def crosses_boundary(self) -> str:
        return "toy numbers"

    def model_config(self) -> dict[str, Any]:
        return {}

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        assert unit.data is not None
        goal = TARGET + (unit.data[0] - 2) * 0.1
        return UnitResult((weights + 0.5 * (goal - weights)).astype(np.float32), num_examples=int(unit.data.size),
                          metrics={"train_loss": float(unit.data[0])})

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        if np.abs(weights).max() > 1e6:
            return {"val_loss": float("nan")}
        return {"val_loss": float(np.mean((weights.astype(np.float64) - TARGET) ** 2)) + 0.01}


@dataclass
class ToyPackage:
    task: Task
    data: TaskData
    initial_weights: np.ndarray
    fingerprint: str = "toy0"


def toy_package(units: int = 6) -> ToyPackage:
    chunks = [np.full(3 + i, i, dtype=np.int32) for i in range(units)]
    return ToyPackage(ToyTask(), TaskData(num_units=units, units=chunks), np.zeros(4, dtype=np.float32))


def test_rounds_follow_the_plan_and_fill_the_history(tmp_path: Path) -> None:
    package = toy_package(6)
    session = Session.create(package, SessionConfig(merge="fedavg", participants=2, passes=2, seed=3),
                             directory=tmp_path)
    assert session.num_rounds == 6 and session.round == 0 and session.initial_metrics is not None
    seen = []
    while not session.done:
        planned = session.assignments()
        assert planned == session.plan.units_for_round(session.round)
        entry = run_round(session)
        seen += entry["units"]
        assert entry["round"] == session.round - 1
        assert entry["participants"] == 2 and entry["missing"] == [] and entry["events"] == []
        assert entry["examples"] == sum(3 + u for u in entry["units"])
        assert entry["merge"] == "fedavg" and set(entry["metrics"]) == {"val_loss"}
        assert set(entry["seconds"]) == {"train", "merge", "validate"}
    assert sorted(seen) == sorted(list(range(6)) * 2)  # every unit once per pass
    assert [e["round"] for e in session.history] == list(range(6))
    assert checkpoint.read_history(tmp_path) == session.history
    series = session.metric_series()
    assert len(series) == 7 and series[-1] < series[0]
    with pytest.raises(SessionError, match="over"):
        session.complete_round([])


def test_round_rejects_foreign_and_duplicate_results_and_merges_in_slot_order() -> None:
    package = toy_package(6)
    a = Session.create(package, SessionConfig(merge="fedavg", participants=3, passes=1))
    b = Session.create(package, SessionConfig(merge="fedavg", participants=3, passes=1))
    results = [(x, a.task.train_unit(a.weights, a.work_unit(x))) for x in a.assignments()]
    with pytest.raises(SessionError, match="no results"):
        a.complete_round([])
    with pytest.raises(SessionError, match="two results"):
        a.complete_round([results[0], results[0]])
    with pytest.raises(SessionError, match="not an assignment of round 0"):
        a.complete_round([(a.assignments(1)[0], results[0][1])])
    a.complete_round(results)
    b.complete_round(list(reversed(results)))
    assert a.weights.tobytes() == b.weights.tobytes()


def test_missing_assignments_are_recorded() -> None:
    session = Session.create(toy_package(6), SessionConfig(merge="fedavg", participants=3, passes=1))
    planned = session.assignments()
    entry = session.complete_round([(planned[1], session.task.train_unit(session.weights,
                                                                       session.work_unit(planned[1])))])
    assert entry["participants"] == 1
    assert entry["missing"] == [planned[0].unit_index, planned[2].unit_index]


def test_guard_refuses_momentum_on_a_single_chunk_unless_forced() -> None:
    package = toy_package(1)
    with pytest.raises(MergeGuardRefused, match="Use 'fedavg'"):
        Session.create(package, SessionConfig(merge="fedavgm", participants=1, passes=5))
    with pytest.raises(MergeGuardRefused, match="fedadam"):
        Session.create(package, SessionConfig(merge="fedadam", participants=1, passes=5))
    Session.create(package, SessionConfig(merge="fedavg", participants=1, passes=5))
    forced = Session.create(package, SessionConfig(merge="fedavgm", participants=1, passes=5, force=True))
    assert forced.merge.name == "fedavgm"


def exploding(session: Session, scale: float) -> list[tuple[Any, UnitResult]]:
    """The current round's results with one peer's weights blown up (an injected bad result)."""
    results = [(x, session.task.train_unit(session.weights, session.work_unit(x))) for x in session.assignments()]
    assignment, good = results[0]
    results[0] = (assignment, UnitResult(np.full(4, scale, dtype=np.float32), num_examples=10_000))
    return results


def test_divergence_stop_ends_the_session(tmp_path: Path) -> None:
    session = Session.create(toy_package(6), SessionConfig(merge="fedavg", participants=2, passes=3),
                             directory=tmp_path)
    run_round(session)
    run_round(session)
    entry = session.complete_round(exploding(session, 50.0))
    assert entry["events"][0]["type"] == "divergence" and entry["events"][0]["action"] == "stop"
    assert "x best" in entry["events"][0]["reason"]
    assert session.done and session.stopped is not None and session.round == 3 < session.num_rounds
    restored = Session.restore(tmp_path, toy_package(6))
    assert restored.done and restored.stopped == session.stopped


@pytest.mark.parametrize("scale, reason", [(50.0, "x best"), (1e7, "nan")])
def test_divergence_rollback_restores_best_weights_and_resets_merge_state(tmp_path: Path, scale: float,
                                                                          reason: str) -> None:
    config = SessionConfig(merge="fedavgm", merge_config={"server_momentum": 0.5}, participants=2, passes=3,
                           on_divergence="rollback")
    session = Session.create(toy_package(6), config, directory=tmp_path)
    run_round(session)
    run_round(session)
    assert isinstance(session.merge, FedAvgM) and session.merge.t == 2
    best_weights, best_round = session.best_weights.copy(), session.best_round
    entry = session.complete_round(exploding(session, scale))
    event = entry["events"][0]
    assert event["action"] == "rollback" and reason in event["reason"] and event["restored_round"] == best_round
    assert session.weights.tobytes() == best_weights.tobytes()
    assert session.merge.state_dict() == {"t": 0}
    assert not session.done
    run_round(session)  # training goes on from the best weights
    assert session.round == 4 and session.history[-1]["events"] == []
    assert checkpoint.read_best(tmp_path).weights.tobytes() == session.best_weights.tobytes()


def test_rollback_on_the_first_round_returns_to_the_initial_weights() -> None:
    session = Session.create(toy_package(6), SessionConfig(merge="fedavg", participants=2, passes=1,
                                                           on_divergence="rollback"))
    entry = session.complete_round(exploding(session, 1e7))
    assert entry["events"][0]["restored_round"] is None
    assert session.weights.tobytes() == np.zeros(4, dtype=np.float32).tobytes()
    line = json.dumps(entry)  # standard JSON: the NaN metric is written as null
    assert "NaN" not in line and entry["metrics"]["val_loss"] is None


def test_config_round_trips_and_refuses_bad_values() -> None:
    config = SessionConfig(merge="fedadam", merge_config={"eta": 0.03}, max_rounds=4, on_divergence="rollback")
    assert SessionConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    with pytest.raises(SessionError, match="on_divergence"):
        SessionConfig(on_divergence="explode")  # type: ignore[arg-type]
    with pytest.raises(SessionError, match="divergence_factor"):
        SessionConfig(divergence_factor=1.0)
    with pytest.raises(SessionError, match="unknown"):
        SessionConfig.from_json({"merge": "fedavg", "colour": "red"})


# -- checkpoints with the real byte-level task ------------------------------------------------------------
@pytest.fixture(scope="module")
def text_package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    return build_text_package(tmp_path_factory.mktemp("package"), chunks=6)


@pytest.mark.parametrize("merge, merge_config, codec", [("fedavgm", {"server_momentum": 0.9}, "none"),
                                                        ("fedadam", {"eta": 0.01}, "none"),
                                                        ("fedavgm", {"server_momentum": 0.9}, "topk"),
                                                        ("fedavg", {}, "int8")])
def test_resume_mid_session_is_bit_identical(tmp_path: Path, text_package: Package, merge: str,
                                             merge_config: dict[str, Any], codec: str) -> None:
    """With a compressing codec the weights move by decoded steps; topk's server residual (what the steps dropped)
    is in the checkpoint, so a resumed session takes the same steps."""
    config = SessionConfig(merge=merge, merge_config=merge_config, participants=2, passes=1, seed=5, codec=codec,
                           topk_fraction=0.1)
    straight = Session.create(text_package, config, directory=tmp_path / "straight")
    while not straight.done:
        run_round(straight)

    interrupted = Session.create(text_package, config, directory=tmp_path / "resumed")
    run_round(interrupted)
    run_round(interrupted)
    residual = interrupted.downloads.feedback.residual.copy()
    del interrupted
    resumed = Session.restore(tmp_path / "resumed")  # the package comes from session.json
    assert resumed.round == 2 and len(resumed.history) == 2
    assert np.array_equal(resumed.downloads.feedback.residual, residual)
    assert (np.abs(residual).sum() > 0) == (codec == "topk")
    while not resumed.done:
        run_round(resumed)

    assert resumed.weights.tobytes() == straight.weights.tobytes()
    assert resumed.best_weights.tobytes() == straight.best_weights.tobytes()
    assert resumed.best_round == straight.best_round and resumed.best_metric == straight.best_metric
    for key, value in straight.merge.state_dict().items():
        other = resumed.merge.state_dict()[key]
        assert (value.tobytes() == other.tobytes()) if isinstance(value, np.ndarray) else value == other
    assert [e["metrics"] for e in resumed.history] == [e["metrics"] for e in straight.history]
    assert checkpoint.read_history(tmp_path / "resumed") == resumed.history
    assert all(("download" in entry) == (codec != "none") for entry in resumed.history)


def test_checkpoint_files_pointer_and_crash_leftovers(tmp_path: Path, text_package: Package) -> None:
    config = SessionConfig(merge="fedavg", participants=2, passes=2, keep_checkpoints=2)
    session = Session.create(text_package, config, directory=tmp_path)
    for _ in range(3):
        run_round(session)
    assert (tmp_path / checkpoint.LATEST_FILE).read_text().strip() == "rounds/000003"
    assert sorted(p.name for p in (tmp_path / "rounds").iterdir()) == ["000002", "000003"]
    assert not list(tmp_path.glob("*.tmp"))
    stored = checkpoint.read_latest(tmp_path)
    assert stored.spec == text_package.spec and stored.weights.dtype == np.float32
    assert stored.weights.tobytes() == session.weights.tobytes()
    assert stored.state["round"] == 3 and split_server_state(stored.merge_state)[0] == {}  # FedAvg keeps none
    assert checkpoint.read_best(tmp_path).weights.tobytes() == session.best_weights.tobytes()

    # A crash after the history line of a round but before its checkpoint: the restore drops the line.
    checkpoint.append_history(tmp_path, [{"round": 3, "metrics": {}}])
    restored = Session.restore(tmp_path)
    assert len(restored.history) == 3 and len(checkpoint.read_history(tmp_path)) == 3


def test_restore_refuses_another_package(tmp_path: Path, text_package: Package) -> None:
    Session.create(text_package, SessionConfig(participants=2, passes=1), directory=tmp_path)
    other = toy_package(6)
    with pytest.raises(checkpoint.CheckpointError, match="trained on package"):
        Session.restore(tmp_path, other)
    with pytest.raises(checkpoint.CheckpointError, match="no session"):
        Session.restore(tmp_path / "nowhere")


def test_carried_units_keep_every_unit_once_per_pass_and_survive_a_restart(tmp_path: Path) -> None:
    """A round deadline merges what it has; the rest opens the next round (``carry_missing``): each unit is
    still trained exactly once per pass, no round holds a unit twice, and the round count grows."""
    package = toy_package(7)
    config = SessionConfig(merge="fedavg", participants=3, passes=3, seed=5)
    session = Session.create(package, config, directory=tmp_path)
    planned_rounds = session.num_rounds
    assert planned_rounds == 7
    trained: list[tuple[int, int]] = []  # (pass, unit) of every merged result
    carried_total = 0
    while not session.done:
        planned = session.assignments()
        assert len({a.unit_index for a in planned}) == len(planned)  # never one unit twice in a round
        keep = planned if session.round % 2 else planned[1:] or planned  # odd rounds complete, even ones miss one
        if session.round == 3:  # a restart in the middle, with a unit carried
            session = Session.restore(tmp_path, package)
            assert session.carried and session.assignments() == planned
        results = [(a, session.task.train_unit(session.weights, session.work_unit(a))) for a in keep]
        entry = session.complete_round(results, carry_missing=True)
        trained += [(a.pass_index, a.unit_index) for a in keep]
        carried_total += len(entry.get("carried", []))
        if entry.get("carried") and not session.done:  # the next round opens with them, saying where from
            opening = session.assignments()[: len(entry["carried"])]
            assert [a.unit_index for a in opening] == entry["carried"]
            assert all((session.carried_from(a) or 0) <= entry["round"] for a in opening)
    assert sorted(trained) == sorted((p, u) for p in range(3) for u in range(7))  # once per pass, none lost
    assert carried_total > 0 and session.round > planned_rounds  # the plan grew by what was carried
    moved = [(e["round"], c["unit"], c["from_round"]) for e in session.history for c in e.get("carried_in", [])]
    assert moved and all(r > from_round for r, _, from_round in moved)


def test_without_carrying_a_missing_unit_is_dropped_as_before() -> None:
    package = toy_package(6)
    session = Session.create(package, SessionConfig(merge="fedavg", participants=2, passes=1, seed=3))
    first = session.assignments()
    entry = session.complete_round([(first[0], session.task.train_unit(session.weights, session.work_unit(first[0])))])
    assert entry["missing"] == [first[1].unit_index] and "carried" not in entry
    assert session.assignments() == session.plan.units_for_round(1) and session.num_rounds == 3


def test_history_diagnostics_follow_the_weights() -> None:
    """FedAvg's step is the round's delta, so the diagnostics can be checked against the weights' own moves;
    FedAvgM's step is longer than its delta once momentum builds up."""
    session = Session.create(toy_package(6), SessionConfig(merge="fedavg", participants=2, passes=2, seed=3))
    moves = []
    while not session.done:
        before = session.weights.astype(np.float64)
        entry = run_round(session)
        moves.append(session.weights.astype(np.float64) - before)
        diagnostics = entry["diagnostics"]
        assert diagnostics["pseudo_gradient_norm"] == pytest.approx(np.linalg.norm(moves[-1]), rel=1e-6)
        assert diagnostics["step_norm"] == pytest.approx(diagnostics["pseudo_gradient_norm"], rel=1e-6)
        assert diagnostics["tensor_rms"]["largest"] == "w" and diagnostics["spread"] == 0.0  # one tensor
        if len(moves) == 1:
            assert diagnostics["cosine_previous"] is None
        else:
            a, b = moves[-1], moves[-2]
            assert diagnostics["cosine_previous"] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b),
                                                                   rel=1e-5)
    momentum = Session.create(toy_package(6), SessionConfig(merge="fedavgm", participants=2, passes=2, seed=3,
                                                            force=True))
    entries = [run_round(momentum) for _ in range(3)]
    first, third = entries[0]["diagnostics"], entries[2]["diagnostics"]
    assert first["step_norm"] == pytest.approx(first["pseudo_gradient_norm"])  # round 1: momentum is the delta
    assert third["step_norm"] > third["pseudo_gradient_norm"]  # agreeing rounds: momentum lengthens the step


def test_an_aggregator_that_holds_every_result_is_refused_past_the_memory_a_merge_may_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    package = toy_package(6)
    size = package.task.spec().size
    # What this machine's half of its memory would be if it held only 4 results of this model in float64 twice.
    monkeypatch.setattr("server.session.session.merge_memory_bytes", lambda: 16 * size * 4)
    with pytest.raises(SessionError, match=r"median holds every result of a round at once, 16 bytes a weight: k=5"):
        Session.create(package, SessionConfig(aggregate="median", participants=5))
    Session.create(package, SessionConfig(aggregate="median", participants=4))
    for aggregate in ("mean", "centered_clipping"):  # (one result at a time: any k)
        Session.create(package, SessionConfig(aggregate=aggregate, participants=6))
    with pytest.raises(SessionError, match="krum with f=1 needs more than 4 results a round"):
        Session.create(package, SessionConfig(aggregate="krum", aggregate_config={"f": 1}, participants=4))
