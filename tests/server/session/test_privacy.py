"""Central user-level DP as a stage of the merge: clipping, the noise's size, adaptive clipping, the session's
epsilon in the history and the checkpoint, the budget stop, and settings that are refused."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.aggregate import Krum, Mean
from runtime.merge import FedAvg, Result
from runtime.privacy import clip_to_norm, next_clip, split_noise
from runtime.tasks import Task, TaskData, UnitResult, WorkUnit
from runtime.weights import WeightSpec
from server.session import accountant
from server.session.privacy import CentralPrivacy, PrivacySettings, PrivateAggregation
from server.session.session import Session, SessionConfig, SessionError
from server.session.settings import SettingError


def stage(aggregator: Any, units: list[str], *, clip: float, z: float, seed: int = 0,
          quantile: float | None = None) -> PrivateAggregation:
    return PrivateAggregation(inner=aggregator, contributors=units, clip=clip, noise_multiplier=z,
                              target_quantile=quantile, rng=np.random.default_rng(seed))


def test_clip_to_norm_scales_long_updates_to_the_clip_and_leaves_short_ones() -> None:
    long, norm = clip_to_norm(np.array([3.0, 4.0]), 1.0)
    assert norm == 5.0 and np.allclose(long, [0.6, 0.8]) and np.linalg.norm(long) == pytest.approx(1.0, abs=1e-15)
    short, norm = clip_to_norm(np.array([0.3, 0.4]), 1.0)
    assert norm == pytest.approx(0.5) and np.array_equal(short, [0.3, 0.4])


def test_the_stage_averages_clipped_updates_equally_before_noise() -> None:
    """Hand-made: updates (3, 4), (0, 0.5) and (-10, 0) around global (1, 1) with C = 1 clip to (0.6, 0.8), (0, 0.5),
    (-1, 0); each weighs the same whatever its example count; the mean is (-0.4/3, 1.3/3)."""
    g = np.array([1.0, 1.0])
    vectors = [g + [3.0, 4.0], g + [0.0, 0.5], g + [-10.0, 0.0]]
    quiet = stage(Mean(), ["unit 0", "unit 1", "unit 2"], clip=1.0, z=1e-12)
    merged = FedAvg().merge(g, [Result(v, n) for v, n in zip(vectors, [1, 50, 7], strict=True)], aggregator=quiet)
    assert np.allclose(merged, g + np.array([-0.4, 1.3]) / 3, atol=1e-6)
    assert quiet.report["contributors"] == 3 and quiet.report["clip"] == 1.0


def test_the_noise_has_z_c_over_m_standard_deviation() -> None:
    """Over 400 seeded rounds of 500 coordinates: the noise's measured standard deviation is z C / m (the mean's
    sensitivity C/m), within 1 %; Krum's (it picks one update) is z 2C."""
    g = np.zeros(500)
    vectors = [g + 5.0, g - 5.0, g + np.linspace(-3, 3, 500), g + 0.1]  # m = 4, every update clipped to C = 0.5
    units = ["a", "b", "c", "d"]
    draws = []
    for seed in range(400):
        quiet = stage(Mean(), units, clip=0.5, z=1e-12, seed=seed).combine(g, vectors, [1, 1, 1, 1])
        noisy = stage(Mean(), units, clip=0.5, z=2.0, seed=seed).combine(g, vectors, [1, 1, 1, 1])
        draws.append(noisy - quiet)
    measured = float(np.std(np.concatenate(draws)))
    assert measured == pytest.approx(2.0 * 0.5 / 4, rel=0.01)
    assert np.mean(np.concatenate(draws)) == pytest.approx(0.0, abs=0.002)
    krum = [stage(Krum(f=0), units, clip=0.5, z=2.0, seed=s).combine(g, vectors, [1] * 4)
            - stage(Krum(f=0), units, clip=0.5, z=1e-12, seed=s).combine(g, vectors, [1] * 4) for s in range(40)]
    assert float(np.std(np.concatenate(krum))) == pytest.approx(2.0 * 2 * 0.5, rel=0.02)


def test_the_noise_is_seeded_and_results_of_one_privacy_unit_count_once() -> None:
    g = np.zeros(3)
    vectors = [g + [2.0, 0.0, 0.0], g + [0.0, 2.0, 0.0], g + [0.0, 0.0, 0.4]]
    a = stage(Mean(), ["peer x", "peer x", "peer y"], clip=1.0, z=1.0, seed=7).combine(g, vectors, [1, 1, 1])
    b = stage(Mean(), ["peer x", "peer x", "peer y"], clip=1.0, z=1.0, seed=7).combine(g, vectors, [1, 1, 1])
    assert np.array_equal(a, b)
    grouped = stage(Mean(), ["peer x", "peer x", "peer y"], clip=1.0, z=1e-12)
    average = grouped.combine(g, vectors, [1, 1, 1])
    # peer x's updates average to (1, 1, 0), norm sqrt 2, clipped to (0.707, 0.707, 0); peer y's (0, 0, 0.4) stays
    assert grouped.report["contributors"] == 2
    assert np.allclose(average, [math.sqrt(0.5) / 2, math.sqrt(0.5) / 2, 0.2], atol=1e-9)


def test_adaptive_clipping_splits_the_noise_into_one_gaussian_of_z() -> None:
    update, count = split_noise(1.3, adaptive=True)
    assert update ** -2 + (2 * count) ** -2 == pytest.approx(1.3 ** -2, rel=1e-12)
    assert split_noise(1.3, adaptive=False) == (1.3, 0.0)
    assert next_clip(1.0, 0.5, 0.5) == 1.0 and next_clip(1.0, 1.0, 0.5) < 1.0 < next_clip(1.0, 0.0, 0.5)


@pytest.mark.parametrize("quantile", [0.3, 0.5, 0.9])
def test_adaptive_clipping_follows_its_target_quantile(quantile: float) -> None:
    """Andrew et al. 2021: with update norms drawn from one distribution (lognormal around 2), 150 rounds of 200
    updates move C from 0.1 to where the share of norms at most C is the target quantile, counted with noise."""
    rng = np.random.default_rng(11)
    g = np.zeros(8)
    clip = 0.1
    for round_index in range(150):
        norms = np.exp(rng.normal(math.log(2.0), 0.5, 200))
        directions = rng.normal(size=(200, 8))
        vectors = [g + d / np.linalg.norm(d) * n for d, n in zip(directions, norms, strict=True)]
        step = stage(Mean(), [f"u{i}" for i in range(200)], clip=clip, z=1.0, seed=round_index, quantile=quantile)
        step.combine(g, vectors, [1] * 200)
        clip = step.report["next_clip"]
    fresh = np.exp(rng.normal(math.log(2.0), 0.5, 20_000))
    assert float(np.mean(fresh <= clip)) == pytest.approx(quantile, abs=0.06)


# -- in a session -----------------------------------------------------------------------------------------------

class PullTask(Task):
    """Two weights pulled towards 1 by each unit; val_loss = squared distance to 1 (plus a floor)."""

    name = "pull"
    metric = "val_loss"

    def spec(self) -> WeightSpec:
        return WeightSpec((("w", (2,)),))

    def crosses_boundary(self) -> str:
        return "two numbers"

    def model_config(self) -> dict[str, Any]:
        return {}

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        assert unit.data is not None
        return UnitResult((weights + 0.5 * (1.0 - weights)).astype(np.float32), num_examples=int(unit.data.size))

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        return {"val_loss": float(np.mean((weights.astype(np.float64) - 1.0) ** 2)) + 0.01}


@dataclass
class PullPackage:
    task: Task
    data: TaskData
    initial_weights: np.ndarray
    fingerprint: str = "pull0"


def pull_package(units: int = 4) -> PullPackage:
    return PullPackage(PullTask(), TaskData(num_units=units, units=[np.ones(3, np.int32)] * units),
                       np.zeros(2, np.float32))


def run_all(session: Session) -> None:
    for _ in range(50):
        if session.done:
            return
        session.complete_round([(a, session.task.train_unit(session.weights, session.work_unit(a)))
                                for a in session.assignments()])


DP = {"aggregate": "mean", "dp_noise_multiplier": 1.0, "dp_clip": 0.2}


def test_a_session_records_epsilon_after_every_round_and_keeps_it_across_a_restart(tmp_path: Path) -> None:
    config = SessionConfig(participants=2, passes=3, **DP)
    session = Session.create(pull_package(4), config, directory=tmp_path)  # 2 rounds a pass, 6 rounds
    assert session.describe()["privacy"]["planned_epsilon"] == pytest.approx(accountant.epsilon(1.0, 3, 1e-6))
    for _ in range(3):
        session.complete_round([(a, session.task.train_unit(session.weights, session.work_unit(a)))
                                for a in session.assignments()])
    epsilons = [entry["privacy"]["epsilon"] for entry in session.history]
    # each unit of 4 is in a round once per pass: after rounds 1, 2 once, after round 3 twice
    assert epsilons == pytest.approx([accountant.epsilon(1.0, n, 1e-6) for n in (1, 1, 2)])
    assert all(entry["privacy"]["noise_std"] == pytest.approx(1.0 * 0.2 / 2) for entry in session.history)
    restored = Session.restore(tmp_path, session.package)
    assert restored.privacy is not None and session.privacy is not None
    assert restored.privacy.rounds_of == session.privacy.rounds_of and restored.privacy.key == session.privacy.key
    run_all(session)
    run_all(restored)
    assert session.weights.tobytes() == restored.weights.tobytes()  # the same noise after a restart
    assert "key" not in json.dumps(session.describe())


def test_the_session_stops_before_a_round_that_would_pass_the_budget(tmp_path: Path) -> None:
    budget = (accountant.epsilon(1.0, 2, 1e-6) + accountant.epsilon(1.0, 3, 1e-6)) / 2  # two passes fit, not three
    session = Session.create(pull_package(4), SessionConfig(participants=2, passes=3, dp_epsilon_budget=budget,
                                                            **DP), directory=tmp_path)
    run_all(session)
    assert session.round == 4 and session.stopped is not None and "privacy budget" in session.stopped
    assert session.history[-1]["events"][-1]["type"] == "privacy_budget"
    assert max(e["privacy"]["epsilon"] for e in session.history) <= budget
    assert Session.restore(tmp_path, session.package).done
    with pytest.raises(SessionError, match="past the budget"):
        Session.create(pull_package(4), SessionConfig(participants=2, dp_epsilon_budget=0.5, **DP))


def test_a_session_without_dp_says_so() -> None:
    session = Session.create(pull_package(4), SessionConfig(participants=2, passes=1))
    run_all(session)
    assert session.describe()["privacy"]["enabled"] is False and "privacy" not in session.history[0]


@pytest.mark.parametrize(("changes", "words"), [
    ({"dp_clip": 0.5}, "needs differential privacy's noise"),
    ({"dp_epsilon_budget": 3.0, "dp_adaptive_clip": 0.5}, "need differential privacy's noise"),
    ({"dp_noise_multiplier": 1.0}, "centered_clipping has no such bound"),
    ({"dp_noise_multiplier": 1.0, "aggregate": "median"}, "median has no such bound"),
    ({"dp_noise_multiplier": 1.0, "aggregate": "mean", "mode": "async"}, "not offered with --mode async"),
])
def test_settings_that_cannot_hold_are_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(SessionError, match=words):
        SessionConfig(**changes)


@pytest.mark.parametrize(("key", "value"), [("dp_noise_multiplier", 0.0), ("dp_clip", -1.0),
                                            ("dp_adaptive_clip", 1.5), ("dp_delta", 0.5),
                                            ("dp_epsilon_budget", 0.0)])
def test_bad_values_name_the_setting(key: str, value: float) -> None:
    with pytest.raises(SettingError, match=key):
        SessionConfig(aggregate="mean", **{"dp_noise_multiplier": 1.0, key: value})


def test_the_privacy_stage_refuses_a_results_without_their_privacy_units() -> None:
    privacy = CentralPrivacy(PrivacySettings(1.0), aggregate="mean", key=5)
    step = privacy.stage(Mean(), 0, ["unit 1"])
    with pytest.raises(SessionError, match="privacy units named"):
        step.combine(np.zeros(2), [np.ones(2), np.ones(2)], [1, 1])


def test_an_exports_metadata_carries_the_epsilon_of_its_rounds() -> None:
    from server.session.export import model_metadata
    from server.session.privacy import of_weights

    session = Session.create(pull_package(4), SessionConfig(participants=2, passes=2, **DP))
    run_all(session)
    metadata = model_metadata(spec=session.spec, task_info={}, model_config={}, round_index=session.round,
                              fingerprint="x", privacy=of_weights(session.history, session.round, True))
    said = json.loads(metadata["privacy"])
    assert said == {"enabled": True, "rounds": 4, "epsilon": accountant.epsilon(1.0, 2, 1e-6), "delta": 1e-6,
                    "budget": None}
    assert of_weights(session.history, 0, True)["epsilon"] == 0.0 and of_weights([], 3, False) == {"enabled": False}
