from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from runtime.merge import UnknownMerge
from runtime.planner import (
    STATEFUL_MERGE_MAX_SHARE,
    Assignment,
    InvalidPlan,
    MergeGuardRefused,
    RoundOutOfRange,
    RoundPlan,
    check_merge_guard,
    pass_permutation,
    unit_seed,
)

PLANS = [(55, 5, 3), (7, 5, 3), (10, 3, 4), (1, 1, 3), (5, 5, 2), (9, 4, 5), (6, 1, 2)]


def all_assignments(plan: RoundPlan) -> list[Assignment]:
    return [a for r in range(plan.num_rounds) for a in plan.units_for_round(r)]


def test_55_units_5_per_round_3_passes_is_33_rounds_of_5() -> None:
    plan = RoundPlan(num_units=55, participants_per_round=5, passes=3, seed=7)
    assert plan.num_rounds == 33  # ceil(3 * 55 / 5) = 33
    assert [len(plan.units_for_round(r)) for r in range(33)] == [5] * 33


@pytest.mark.parametrize("units, k, passes", PLANS)
def test_each_unit_exactly_once_per_pass(units: int, k: int, passes: int) -> None:
    plan = RoundPlan(units, k, passes, seed=3)
    assignments = all_assignments(plan)
    assert len(assignments) == units * passes
    for pass_index in range(passes):
        trained = sorted(a.unit_index for a in assignments if a.pass_index == pass_index)
        assert trained == list(range(units))


@pytest.mark.parametrize("units, k, passes", PLANS)
def test_rounds_are_well_formed(units: int, k: int, passes: int) -> None:
    plan = RoundPlan(units, k, passes, seed=11)
    assert plan.num_rounds == -(-units * passes // k)
    for round_index in range(plan.num_rounds):
        assignments = plan.units_for_round(round_index)
        assert [a.slot for a in assignments] == list(range(len(assignments)))
        assert all(a.round == round_index for a in assignments)
        assert len({a.unit_index for a in assignments}) == len(assignments)  # no unit twice in a round
        if round_index < plan.num_rounds - 1:
            assert len(assignments) == k


@pytest.mark.parametrize("units, k, passes", [(7, 5, 3), (9, 4, 5), (3, 2, 6)])
def test_no_round_repeats_a_unit_across_a_pass_boundary(units: int, k: int, passes: int) -> None:
    for seed in range(40):  # with a plain concatenation, some of these seeds would repeat a unit
        plan = RoundPlan(units, k, passes, seed)
        for round_index in range(plan.num_rounds):
            unit_indices = [a.unit_index for a in plan.units_for_round(round_index)]
            assert len(set(unit_indices)) == len(unit_indices), (seed, round_index, unit_indices)


def test_rounds_span_pass_boundaries_and_last_round_is_short() -> None:
    plan = RoundPlan(7, 5, 3, seed=0)
    # 21 unit visits in rounds of 5: 5, 5, 5, 5, 1
    assert [len(plan.units_for_round(r)) for r in range(plan.num_rounds)] == [5, 5, 5, 5, 1]
    # round 1 holds the last 2 units of pass 0 and the first 3 of pass 1
    assert [a.pass_index for a in plan.units_for_round(1)] == [0, 0, 1, 1, 1]


def test_same_seed_same_order_other_seed_other_order() -> None:
    def order(seed: int) -> list[tuple[int, int]]:
        return [(a.pass_index, a.unit_index) for a in all_assignments(RoundPlan(55, 5, 3, seed))]

    assert order(42) == order(42)
    assert order(42) != order(43)
    # passes are drawn independently: the three passes are not the same permutation
    by_pass = [[u for p, u in order(42) if p == pass_index] for pass_index in range(3)]
    assert by_pass[0] != by_pass[1] != by_pass[2]


def test_pass_order_is_the_drawn_permutation_when_rounds_align() -> None:
    plan = RoundPlan(10, 5, 2, seed=5)  # 10 is a multiple of 5: no adjustment at the boundary
    for pass_index in range(2):
        drawn = pass_permutation(5, pass_index, 10)
        assert [u for p, u in plan.schedule if p == pass_index] == drawn
    rng = np.random.default_rng(np.random.SeedSequence([5, 0x6F72646572, 0]))
    assert pass_permutation(5, 0, 10) == list(rng.permutation(10))


def test_unit_seeds_are_stable_and_distinct() -> None:
    plan = RoundPlan(55, 5, 3, seed=7)
    again = RoundPlan(55, 5, 3, seed=7)
    assert all_assignments(plan) == all_assignments(again)
    for a in all_assignments(plan):
        assert a.unit_seed == unit_seed(7, a.pass_index, a.unit_index)
        assert 0 <= a.unit_seed < 2**32
    seeds = Counter(a.unit_seed for a in all_assignments(plan))
    assert max(seeds.values()) == 1  # each (pass, unit) trains with its own seed
    # the same unit in another pass gets another seed; the same (pass, unit) in another session too
    assert unit_seed(7, 0, 3) != unit_seed(7, 1, 3)
    assert unit_seed(7, 0, 3) != unit_seed(8, 0, 3)


def test_unit_seed_regression_pins() -> None:
    # Pinned values (recorded from the first implementation): a change here breaks replaying old sessions.
    first_round = RoundPlan(55, 5, 3, seed=7).units_for_round(0)
    assert [(a.unit_index, a.unit_seed) for a in first_round] == [
        (7, 1350042219),
        (14, 3147668517),
        (36, 3679411970),
        (34, 2750634646),
        (18, 1212966347),
    ]


def test_retrying_a_round_repeats_it() -> None:
    plan = RoundPlan(9, 4, 5, seed=123)
    assert plan.units_for_round(6) == plan.units_for_round(6)
    assert RoundPlan.from_json(plan.to_json()).units_for_round(6) == plan.units_for_round(6)


def test_json_round_trips() -> None:
    plan = RoundPlan(55, 5, 3, seed=7)
    assert json.loads(json.dumps(plan.to_json())) == {
        "num_units": 55,
        "participants_per_round": 5,
        "passes": 3,
        "seed": 7,
    }
    assert RoundPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assignment = plan.units_for_round(2)[3]
    assert Assignment.from_json(json.loads(json.dumps(assignment.to_json()))) == assignment
    with pytest.raises(InvalidPlan, match="exactly the fields"):
        Assignment.from_json({"round": 1})
    with pytest.raises(InvalidPlan, match="exactly the fields"):
        RoundPlan.from_json({**plan.to_json(), "extra": 1})


@pytest.mark.parametrize("round_index", [-1, 33, 1000])
def test_round_out_of_range(round_index: int) -> None:
    with pytest.raises(RoundOutOfRange, match="outside this plan's rounds 0..32"):
        RoundPlan(55, 5, 3, seed=7).units_for_round(round_index)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ((5, 6, 1, 0), "participants_per_round \\(6\\) exceeds num_units \\(5\\)"),
        ((0, 1, 1, 0), "num_units must be an integer >= 1"),
        ((5, 1, 0, 0), "passes must be an integer >= 1"),
        ((5, 1, 1, -1), "seed must be an integer >= 0"),
        ((5, True, 1, 0), "participants_per_round must be"),
        ((5.0, 1, 1, 0), "num_units must be"),
    ],
)
def test_invalid_plans(arguments: tuple, message: str) -> None:
    with pytest.raises(InvalidPlan, match=message):
        RoundPlan(*arguments)


def test_share_of_data_per_round() -> None:
    assert RoundPlan(55, 5, 3, 0).share_of_data_per_round() == 5 / 55
    assert RoundPlan(1, 1, 3, 0).share_of_data_per_round() == 1.0


@pytest.mark.parametrize("merge_name", ["fedavgm", "fedadam"])
def test_guard_refuses_stateful_merge_on_single_chunk_package(merge_name: str) -> None:
    plan = RoundPlan(num_units=1, participants_per_round=1, passes=30, seed=0)
    with pytest.raises(MergeGuardRefused) as caught:
        check_merge_guard(merge_name, plan)
    message = str(caught.value)
    assert merge_name in message and "100%" in message
    assert "one round is a whole pass" in message and "'fedavg'" in message and "--force" in message


def test_guard_allows_fedavg_and_forced_runs() -> None:
    plan = RoundPlan(num_units=1, participants_per_round=1, passes=30, seed=0)
    check_merge_guard("fedavg", plan)
    check_merge_guard("fedavgm", plan, force=True)
    check_merge_guard("fedadam", plan, force=True)


def test_guard_threshold() -> None:
    check_merge_guard("fedavgm", RoundPlan(55, 5, 3, 0))  # 9% per round: the setting FedAvgM is made for
    check_merge_guard("fedadam", RoundPlan(11, 5, 3, 0))  # 45%: below the limit
    at_the_limit = RoundPlan(10, 5, 3, 0)
    assert at_the_limit.share_of_data_per_round() == STATEFUL_MERGE_MAX_SHARE  # (the case below is the boundary)
    with pytest.raises(MergeGuardRefused, match="50%"):
        check_merge_guard("fedadam", at_the_limit)  # exactly half: refused


def test_guard_unknown_merge() -> None:
    with pytest.raises(UnknownMerge):
        check_merge_guard("fedsgd", RoundPlan(55, 5, 3, 0))
