"""The fair protocol of ``peertrain bench merges --study``: which sessions each stage runs, what is chosen on
which split, and the verdict, on series written by hand (the bench runs the real sessions)."""

from __future__ import annotations

import pytest

from server.bench.merge_study import (
    FEDAVG,
    SERVER_GRID,
    Recipe,
    Run,
    Series,
    StudyPlan,
    first_round_reaching,
    judge,
    neighbour,
    rate_for,
)
from server.simulation.simulator import MergeChoice

SGD = Recipe("client-sgd", {"optimizer": "sgd"}, (0.1, 0.3, 1.0, 3.0))
ADAM = MergeChoice("fedadam", {"eta": 0.01})
MOMENTUM = MergeChoice("fedavgm", {"server_momentum": 0.9})


def flat(final_val: float, final_report: float, rounds: int = 33, start: float = 5.0) -> Series:
    """A loss falling in a straight line from ``start`` to the finals."""
    val = [start + (final_val - start) * r / rounds for r in range(rounds + 1)]
    report = [start + (final_report - start) * r / rounds for r in range(rounds + 1)]
    return Series(val, report)


def test_rates_snap_to_the_grid() -> None:
    assert rate_for(SGD.rates, 1.0 / 3) == 0.3 and rate_for(SGD.rates, 1.0 / 10) == 0.1
    assert rate_for(SGD.rates, 0.1 / 3) == 0.033 and rate_for(SGD.rates, 0.3 / 10) == 0.03


def test_stages_follow_the_protocol() -> None:
    plan = StudyPlan(recipes=[SGD], grid=[ADAM, MOMENTUM], seeds=(0, 1, 2), top=1)
    assert plan.stage1() == [Run.of("client-sgd", lr, FEDAVG) for lr in SGD.rates]
    for run, final in zip(plan.stage1(), (2.0, 1.8, 1.7, 9.0), strict=True):  # lr 1.0 is FedAvg's best
        plan.results[run] = flat(final, final)
    assert plan.best_rate(SGD) == 1.0 and plan.rates_around(SGD) == [1.0, 0.3, 0.1]
    stage2 = plan.stage2()
    # the server settings at every rate; FedAvg at those rates was already run in stage 1
    assert stage2 == [Run.of("client-sgd", lr, choice) for lr in (1.0, 0.3, 0.1) for choice in (ADAM, MOMENTUM)]
    assert plan.extension(SGD) is None  # lr 1.0 has both neighbours: tuned
    assert plan.planned_sessions() == 4 + 2 + 3 * 3 + 2 * 2  # (2: rates past the edge, at most)
    for run in stage2:
        # FedAdam at lr 0.3 is best on the tuning half but worst on the report half: chosen all the same
        plan.results[run] = flat(1.5, 3.0) if (run.choice, run.lr) == (ADAM, 0.3) else flat(1.9, 1.6)
    chosen = plan.chosen(SGD)
    assert chosen == [Run.of("client-sgd", 1.0, FEDAVG), Run.of("client-sgd", 0.3, ADAM)]
    assert plan.stage3() == [r.with_seed(seed) for r in chosen for seed in (1, 2)]


def test_the_verdict_is_on_the_report_half_over_every_seed() -> None:
    plan = StudyPlan(recipes=[SGD], grid=[ADAM], seeds=(0, 1, 2), top=1)
    plan.results[Run.of("client-sgd", 1.0, FEDAVG)] = flat(2.0, 2.0)
    plan.results[Run.of("client-sgd", 1.0, ADAM)] = flat(1.0, 1.3)
    for seed in (1, 2):
        plan.results[Run.of("client-sgd", 1.0, FEDAVG, seed)] = flat(2.0, 2.0)
        plan.results[Run.of("client-sgd", 1.0, ADAM, seed)] = flat(1.0, 1.3 if seed == 1 else 1.6)
    verdict = judge(plan)
    # FedAvg after 31 rounds: 5 - 3 * 31/33 = 2.1818; FedAdam's line from 5 to 1.3 reaches it after
    # 31/33*3/3.7*33 = 25.1 -> 26 rounds; the seed ending at 1.6 after 28 rounds (2.1818 = 5 - 3.4 r/33)
    assert [row["reached"] for row in verdict.rows] == [[31, 31, 31], [26, 26, 28]]
    fedadam = verdict.rows[1]
    assert fedadam["relative"] == pytest.approx((1.3 + 1.3 + 1.6) / 3 / 2.0 - 1)  # -30%
    assert "does not hold" in verdict.verdict and "26.7 rounds" in verdict.verdict
    assert verdict.anchor == "client-sgd lr=1 fedavg"


def test_first_round_reaching() -> None:
    assert first_round_reaching([5, 4, 3, 2], 3) == 2
    assert first_round_reaching([1, 4, 3, None, float("nan")], 0.5) is None  # round 0 never counts


def test_the_default_grid_holds_the_control_and_every_adaptive_method() -> None:
    names = {choice.name for choice in SERVER_GRID}
    assert names == {"fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad"}
    assert MergeChoice("fedavg", {"server_learning_rate": 2.0}) in SERVER_GRID


def test_a_best_rate_on_the_grids_edge_is_extended_past_it() -> None:
    assert [neighbour(r, up=True) for r in (0.1, 0.3, 1.0, 3.0, 3e-3)] == [0.3, 1.0, 3.0, 10.0, 0.01]
    assert [neighbour(r, up=False) for r in (0.1, 0.3, 1.0, 1e-3)] == [0.03, 0.1, 0.3, 3e-4]
    plan = StudyPlan(recipes=[SGD], grid=[ADAM], seeds=(0,), top=1)
    for run, final in zip(plan.stage1(), (2.0, 1.9, 1.8, 1.7), strict=True):  # the largest rate is the best
        plan.results[run] = flat(final, final)
    assert plan.extension(SGD) == Run.of("client-sgd", 10.0, FEDAVG)
    plan.results[Run.of("client-sgd", 10.0, FEDAVG)] = flat(1.6, 1.6)  # better still
    assert plan.extension(SGD) == Run.of("client-sgd", 30.0, FEDAVG)
    plan.results[Run.of("client-sgd", 30.0, FEDAVG)] = flat(1.5, 1.5)
    assert plan.extension(SGD) is None  # two steps past the edge at most: the study says where it stopped


def test_the_bigger_step_control_is_chosen_beside_the_server_optimizers_but_not_judged_as_one() -> None:
    control = MergeChoice("fedavg", {"server_learning_rate": 2.0})
    plan = StudyPlan(recipes=[SGD], grid=[control, ADAM], seeds=(0, 1), top=1, rerun_controls=True)
    finals = [(FEDAVG, (2.0, 2.0)), (control, (1.0, 1.0)), (ADAM, (1.5, 1.5))]
    for seed in (0, 1):
        for choice, (val, report) in finals:
            plan.results[Run.of("client-sgd", 1.0, choice, seed)] = flat(val, report)
    assert [run.choice for run in plan.chosen(SGD)] == [FEDAVG, control, ADAM]
    verdict = judge(plan)
    assert verdict.verdict.startswith("Best server optimizer: client-sgd lr=1 fedadam eta=0.01: final report_loss "
                                      "-25.0%")
    assert "bigger-step control client-sgd lr=1 fedavg lr=2.0 ends -50.0%" in verdict.verdict


def test_without_reruns_the_control_is_reported_from_its_seed_0_run() -> None:
    control = MergeChoice("fedavg", {"server_learning_rate": 2.0})
    plan = StudyPlan(recipes=[SGD], grid=[control, ADAM], seeds=(0, 1), top=1)
    plan.results[Run.of("client-sgd", 1.0, control)] = flat(1.0, 1.2)
    for seed in (0, 1):
        plan.results[Run.of("client-sgd", 1.0, FEDAVG, seed)] = flat(2.0, 2.0)
        plan.results[Run.of("client-sgd", 1.0, ADAM, seed)] = flat(1.5, 1.5)
    assert [run.choice for run in plan.chosen(SGD)] == [FEDAVG, ADAM]
    assert plan.stage3() == [Run.of("client-sgd", 1.0, FEDAVG, 1), Run.of("client-sgd", 1.0, ADAM, 1)]
    assert "control client-sgd lr=1 fedavg lr=2.0 (seed 0 only) ends -40.0%" in judge(plan).verdict
