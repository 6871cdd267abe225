"""The round planner, shared by the relay and the simulator: which units each round trains, with which seeds.

A session trains ``passes`` (E) passes over ``num_units`` (C) work units (data chunks, or episode
batches) with ``participants_per_round`` (k) assignments per round. Each pass visits the units in
an order drawn from the session seed and the pass number only, so every merge method sees the same
order. The passes' orders are concatenated and cut into rounds of k, giving ceil(E*C/k) rounds
(55 units, k=5, E=3: 33 rounds); only the very last round may be shorter.

Rounds may span two passes: when C is not a multiple of k, the round that holds the end of pass p
is filled up with the start of pass p+1, rather than leaving a short round after every pass. To
keep a round free of duplicate units, the units of pass p+1 that already sit in that shared round
are moved (stably) behind the ones that fill it. The invariant: each unit is trained exactly once
per pass, and no round holds the same unit twice.

Rounds, slots and passes count from 0. ``unit_seed`` depends only on (session seed, pass, unit),
so a retried or reassigned assignment trains exactly as the first attempt would have.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from runtime.merge import merge_class

# Refuse stateful merges (FedAvgM, FedAdam) when one round covers at least this share of a pass.
STATEFUL_MERGE_MAX_SHARE = 0.5

# Separate random streams derived from the same session seed (ASCII "order" and "unit").
_ORDER_STREAM = 0x6F72646572
_UNIT_STREAM = 0x756E6974


class PlanError(ValueError):
    """Base of the planner's errors."""


class InvalidPlan(PlanError):
    """The plan's numbers cannot make a schedule."""


class RoundOutOfRange(PlanError, IndexError):
    """A round number outside 0 .. num_rounds-1."""


class MergeGuardRefused(PlanError):
    """A stateful merge method was asked to run on rounds that each cover a large share of the data."""


@dataclass(frozen=True)
class Assignment:
    """One unit of work in one round: what a peer trains and with which seed."""

    round: int
    slot: int
    pass_index: int
    unit_index: int
    unit_seed: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Assignment:
        names = [f.name for f in fields(cls)]
        if sorted(data) != sorted(names):
            raise InvalidPlan(f"an assignment needs exactly the fields {names}, got {sorted(data)}")
        return cls(**{name: _checked_count(name, data[name], minimum=0) for name in names})


@lru_cache(maxsize=1 << 16)  # (a relay names a unit's seed in every job it hands out: 30 us each)
def unit_seed(session_seed: int, pass_index: int, unit_index: int) -> int:
    """A 32-bit seed (exact in JavaScript numbers) for training ``unit_index`` in ``pass_index``."""
    sequence = np.random.SeedSequence([session_seed, _UNIT_STREAM, pass_index, unit_index])
    return int(sequence.generate_state(1, np.uint32)[0])


def pass_permutation(session_seed: int, pass_index: int, num_units: int) -> list[int]:
    """The order drawn for one pass, before the no-duplicates-in-a-round adjustment."""
    generator = np.random.default_rng(np.random.SeedSequence([session_seed, _ORDER_STREAM, pass_index]))
    return [int(unit) for unit in generator.permutation(num_units)]


@dataclass(frozen=True)
class RoundPlan:
    """The schedule of a session: (num_units C, participants_per_round k, passes E, seed)."""

    num_units: int
    participants_per_round: int
    passes: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("num_units", "participants_per_round", "passes"):
            _checked_count(name, getattr(self, name), minimum=1)
        _checked_count("seed", self.seed, minimum=0)
        if self.participants_per_round > self.num_units:
            raise InvalidPlan(
                f"participants_per_round ({self.participants_per_round}) exceeds num_units ({self.num_units}): "
                f"a round would train a unit twice; use at most {self.num_units}"
            )

    @property
    def num_rounds(self) -> int:
        return math.ceil(self.passes * self.num_units / self.participants_per_round)

    @cached_property
    def schedule(self) -> tuple[tuple[int, int], ...]:
        """Every (pass_index, unit_index) of the session in training order; rounds are slices of k."""
        k = self.participants_per_round
        order: list[tuple[int, int]] = []
        for pass_index in range(self.passes):
            units = pass_permutation(self.seed, pass_index, self.num_units)
            already_in_open_round = len(order) % k
            if already_in_open_round:
                taken = {unit for _, unit in order[-already_in_open_round:]}
                to_fill = k - already_in_open_round
                fillers = [unit for unit in units if unit not in taken][:to_fill]
                chosen = set(fillers)
                units = fillers + [unit for unit in units if unit not in chosen]
            order.extend((pass_index, unit) for unit in units)
        return tuple(order)

    def units_for_round(self, round_index: int) -> list[Assignment]:
        """The assignments of round ``round_index``, one per slot."""
        if isinstance(round_index, bool) or not isinstance(round_index, int | np.integer):
            raise RoundOutOfRange(f"round must be an integer, got {round_index!r}")
        if not 0 <= round_index < self.num_rounds:
            raise RoundOutOfRange(f"round {round_index} is outside this plan's rounds 0..{self.num_rounds - 1}")
        k = self.participants_per_round
        start = int(round_index) * k
        return [
            Assignment(int(round_index), slot, pass_index, unit, unit_seed(self.seed, pass_index, unit))
            for slot, (pass_index, unit) in enumerate(self.schedule[start : start + k])
        ]

    def share_of_data_per_round(self) -> float:
        """Share of a pass's units that one full round trains: k / C."""
        return self.participants_per_round / self.num_units

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundPlan:
        names = [f.name for f in fields(cls)]
        if sorted(data) != sorted(names):
            raise InvalidPlan(f"a round plan needs exactly the fields {names}, got {sorted(data)}")
        return cls(**{name: data[name] for name in names})


def check_merge_guard(merge_name: str, plan: RoundPlan, *, force: bool = False) -> None:
    """Refuse a stateful merge (FedAvgM, FedAdam, FedYogi, FedAdagrad) when a round covers >=
    STATEFUL_MERGE_MAX_SHARE of a pass, unless forced."""
    method = merge_class(merge_name)
    share = plan.share_of_data_per_round()
    if force or not method.is_stateful or share < STATEFUL_MERGE_MAX_SHARE:
        return
    raise MergeGuardRefused(
        f"refusing merge method {merge_name!r}: each round trains {plan.participants_per_round} of "
        f"{plan.num_units} units ({share:.0%} of a pass; the limit for stateful merges is "
        f"{STATEFUL_MERGE_MAX_SHARE:.0%}). FedAvgM and the adaptive ones (FedAdam, FedYogi, FedAdagrad) treat a "
        "round's change as one step and carry it "
        "into the next rounds with server momentum. When one round covers a large share of the data (with a "
        "single-chunk package, one round is a whole pass), that step is already large and momentum makes it grow "
        "every round: an arithmetic model on one chunk has climbed to validation loss 11 by round 30 with "
        "FedAvgM, where FedAvg reached 0.94 by round 20. These methods are meant for many small "
        "rounds. Use 'fedavg', split the data into more units, or pass --force to run it anyway."
    )


def _checked_count(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise InvalidPlan(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
