"""Central user-level differential privacy, a stage of the merge (DP-FedAvg: McMahan et al. 2018), with the
accountant's epsilon after every round and the budget that stops a session.

The order within a merge::

    results ──► grouped by privacy unit (one update per unit per round) ──► each update clipped to C
            ──► the session's aggregator on the clipped updates, each weighing the same
            ──► + N(0, (z_u S)^2), S the aggregate's sensitivity (mean: C / m) ──► the server optimizer's step

Host replays and a second peer's copy check a peer's result as it came, before any of this, so they keep working;
the noise is drawn from a generator keyed by a secret the session keeps (never served), per round, so a restart
repeats it and nobody else can subtract it. The maths is ``runtime.privacy``; the accounting
``server.session.accountant`` (its docstring states what it assumes and how the relay honours it).
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from runtime.aggregate.base import Aggregator, Outliers
from runtime.planner import Assignment
from runtime.privacy import SENSITIVITY, clip_to_norm, gaussian_noise, next_clip, sensitivity, split_noise
from server.session import accountant
from server.session.settings import SessionError

DEFAULT_CLIP = 1.0
DEFAULT_DELTA = 1e-6
@dataclass(frozen=True)
class PrivacySettings:
    """The settings of central DP (the ``dp_*`` fields of ``SessionConfig``)."""

    noise_multiplier: float
    clip: float = DEFAULT_CLIP  # C, or adaptive clipping's first C
    target_quantile: float | None = None  # adaptive clipping's gamma; None: C is fixed
    delta: float = DEFAULT_DELTA
    budget: float | None = None  # epsilon the session may not pass


@dataclass(eq=False)
class PrivateAggregation(Aggregator):
    """One round's DP stage around the session's aggregator: built per merge by ``CentralPrivacy.stage``.

    ``contributors``: each result's privacy unit, in the order of the merge's results."""

    name: ClassVar[str] = "dp"
    is_stateful: ClassVar[bool] = False
    inner: Aggregator = field(default_factory=lambda: Aggregator())
    contributors: Sequence[str] = ()
    clip: float = DEFAULT_CLIP
    noise_multiplier: float = 1.0
    target_quantile: float | None = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    report: dict[str, Any] = field(default_factory=dict)  # what the round did, for the history (noisy values only)

    def combine(self, global_weights: np.ndarray, vectors: Sequence[np.ndarray], counts: Sequence[int]) -> np.ndarray:
        if len(self.contributors) != len(vectors):
            raise SessionError(f"{len(vectors)} results but {len(self.contributors)} privacy units named")
        groups: dict[str, list[int]] = {}
        for index, (unit, count) in enumerate(zip(self.contributors, counts, strict=True)):
            if count > 0:
                groups.setdefault(unit, []).append(index)
        units = list(groups)
        clipped, unclipped = [], 0
        for unit in units:  # one update per privacy unit: the mean of its results' updates, clipped
            update = np.mean([np.asarray(vectors[i], np.float64) - global_weights for i in groups[unit]], axis=0)
            bounded, norm = clip_to_norm(update, self.clip)
            unclipped += int(norm <= self.clip)
            clipped.append(global_weights + bounded)
        m = len(units)
        average = self.inner.combine(global_weights, clipped, [1] * m)  # each privacy unit weighs the same
        self.inner.last_outliers = tuple(sorted(i for g in self.inner.last_outliers for i in groups[units[g]]))
        update_multiplier, count_std = split_noise(self.noise_multiplier, self.target_quantile is not None)
        std = update_multiplier * sensitivity(self.inner.name, self.clip, m)
        noised = average + gaussian_noise(self.rng, average.shape[0], std)
        self.report = {"clip": self.clip, "noise_std": std, "contributors": m, "units": units}
        if self.target_quantile is not None:
            share = (unclipped + float(self.rng.normal(0.0, count_std))) / m  # (Andrew et al.: the noisy count)
            self.report |= {"unclipped_share": share,
                            "next_clip": next_clip(self.clip, share, self.target_quantile)}
        return noised

    def _combine(self, global_weights: np.ndarray, vectors: Sequence[np.ndarray],
                 counts: Sequence[int]) -> tuple[np.ndarray, Outliers]:
        raise NotImplementedError("PrivateAggregation overrides combine")


class CentralPrivacy:
    """A session's DP: its settings, the clip (adaptive clipping moves it), the rounds each privacy unit took part
    in, the noise key, and the epsilon they give. State goes into the checkpoint (``state_json``)."""

    def __init__(self, settings: PrivacySettings, *, aggregate: str, key: int | None = None) -> None:
        check_aggregator(aggregate)
        self.settings = settings
        self.clip = settings.clip
        self.key = secrets.randbits(128) if key is None else key
        self.rounds_of: dict[str, int] = {}
        if settings.budget is not None and self.epsilon_after(1) > settings.budget:
            raise SessionError(f"one round at noise multiplier {settings.noise_multiplier:g} already spends epsilon "
                               f"{self.epsilon_after(1):.3g} at delta {settings.delta:g}, past the budget "
                               f"{settings.budget:g}: raise the noise or the budget (settings dp_noise_multiplier, "
                               "dp_epsilon_budget)")

    def epsilon_after(self, rounds: int) -> float:
        return accountant.epsilon(self.settings.noise_multiplier, rounds, self.settings.delta)

    @property
    def most_rounds(self) -> int:
        """Rounds the most-used privacy unit took part in."""
        return max(self.rounds_of.values(), default=0)

    @property
    def epsilon(self) -> float:
        return self.epsilon_after(self.most_rounds)

    def stage(self, aggregator: Aggregator, round_index: int, contributors: Sequence[str]) -> PrivateAggregation:
        """The DP stage for the merge of ``round_index``: its noise from the key and the round alone."""
        return PrivateAggregation(inner=aggregator, contributors=contributors, clip=self.clip,
                                  noise_multiplier=self.settings.noise_multiplier,
                                  target_quantile=self.settings.target_quantile,
                                  rng=np.random.default_rng([self.key, round_index]))

    def commit(self, stage: PrivateAggregation) -> dict[str, Any]:
        """After a merge went through: count the rounds, move the clip; the history entry's ``privacy``."""
        for unit in stage.report["units"]:
            self.rounds_of[unit] = self.rounds_of.get(unit, 0) + 1
        if "next_clip" in stage.report:
            self.clip = stage.report["next_clip"]
        return {**{k: v for k, v in stage.report.items() if k != "units"}, **self.summary()}

    def next_round_epsilon(self, next_units: Sequence[str] | None) -> float:
        """Epsilon if the next round merges: its privacy units each one round more (``None``: units not known in
        advance, a volunteer's peer: the most-used one once more)."""
        if next_units is None:
            return self.epsilon_after(self.most_rounds + 1)
        return self.epsilon_after(max([self.most_rounds] + [self.rounds_of.get(u, 0) + 1 for u in next_units]))

    def budget_stop(self, kind: str, upcoming: Sequence[Assignment]) -> str | None:
        """Why the session must stop before the round of ``upcoming`` (the budget would be passed), or None. A data
        task's round names its units; a volunteer of a local task may be in any round."""
        budget = self.settings.budget
        if budget is None:
            return None
        after = self.next_round_epsilon(None if kind == "local" else privacy_units(kind, upcoming, None))
        if after <= budget:
            return None
        return (f"privacy budget reached: epsilon is {self.epsilon:.3g} and another round would make it {after:.3g}, "
                f"past the budget {budget:g} (delta {self.settings.delta:g})")

    def summary(self) -> dict[str, Any]:
        value = self.epsilon
        return {"epsilon": value, "delta": self.settings.delta, "rounds_per_unit": self.most_rounds,
                "budget": self.settings.budget}

    def describe(self, kind: str, num_rounds: int, passes: int) -> dict[str, Any]:
        """The status's ``privacy``: settings, epsilon now and at the planned end (a data unit is in a round once
        per pass, a volunteer may be in every round), in words for the page."""
        planned_rounds = num_rounds if kind == "local" else min(passes, num_rounds)
        value = self.epsilon
        planned = self.epsilon_after(planned_rounds)
        return {"enabled": True, **self.summary(), "noise_multiplier": self.settings.noise_multiplier,
                "clip": self.clip, "adaptive_quantile": self.settings.target_quantile,
                "planned_epsilon": planned, "planned_rounds_per_unit": planned_rounds,
                "words": accountant.describe(value) if self.most_rounds else "no round merged yet"}

    def state_json(self) -> dict[str, Any]:
        """What a checkpoint keeps (the key too: the session folder is the host's own)."""
        return {"clip": self.clip, "key": format(self.key, "x"), "rounds_of": dict(self.rounds_of)}

    def load_state_json(self, state: Mapping[str, Any]) -> None:
        self.clip = float(state["clip"])
        self.key = int(state["key"], 16)
        self.rounds_of = {str(k): int(v) for k, v in state["rounds_of"].items()}


NO_PRIVACY = {"enabled": False, "words": "this session adds no differential privacy: the updates peers send, and the "
                                         "model, can reveal things about the data they were trained on"}


def check_aggregator(name: str) -> None:
    """A ``SessionError`` for an aggregator without a sensitivity bound (``runtime.privacy.SENSITIVITY``)."""
    if name not in SENSITIVITY:
        others = " and ".join(n for n in SENSITIVITY if n != "mean")
        raise SessionError(
            f"differential privacy adds noise for how far one person's clipped update can move the aggregate: "
            f"C/k for the mean, 2C for {others}; {name} has no such bound (a coordinate-wise or centred aggregate "
            "of clipped updates can move further), so its epsilon would not hold. Use --aggregate mean (the "
            "clipping already bounds what any one result can do) (settings aggregate, dp_noise_multiplier)")


# The noise a volunteer of a local task may add to their own updates on the page (local DP), and the uploads whose
# epsilon the status lists for it (a page may take several slots a round, and backups; past them the page says "more
# than" the last).
LOCAL_NOISE_CHOICES = (0.5, 1.0, 2.0, 4.0)
LOCAL_UPLOADS_LISTED = 40


def describe(privacy: CentralPrivacy | None, *, kind: str, num_rounds: int, passes: int, clip: float | None,
             delta: float) -> dict[str, Any]:
    """The status's ``privacy``: the session's central DP (or that there is none) and, for a local task, what each
    local noise choice costs a volunteer in epsilon after 1, 2, ... uploads (each upload is a Gaussian mechanism of
    sensitivity C on their data alone: the accountant composes them as rounds)."""
    said = privacy.describe(kind, num_rounds, passes) if privacy is not None else dict(NO_PRIVACY)
    if kind == "local":
        said["local"] = {"clip": DEFAULT_CLIP if clip is None else clip, "delta": delta, "choices": [
            {"noise_multiplier": z, "epsilon": list(local_epsilons(z, delta))} for z in LOCAL_NOISE_CHOICES]}
    return said


@functools.lru_cache(maxsize=64)
def local_epsilons(noise_multiplier: float, delta: float) -> tuple[float, ...]:
    """Epsilon after 1 ... ``LOCAL_UPLOADS_LISTED`` uploads of a volunteer's own noised update. A local session
    computes them when it is made (``warm``), not on the relay's event loop at its first status (160 accountants:
    about a second)."""
    return tuple(accountant.epsilon(noise_multiplier, n, delta) for n in range(1, LOCAL_UPLOADS_LISTED + 1))


def warm(kind: str, delta: float) -> None:
    """Compute what the status will list of local DP (``local_epsilons``) now, for a local task."""
    if kind == "local":
        for z in LOCAL_NOISE_CHOICES:
            local_epsilons(z, delta)


def of_weights(history: Sequence[Mapping[str, Any]], rounds: int, enabled: bool) -> dict[str, Any]:
    """What an export's metadata says of the privacy of weights after ``rounds`` rounds: the epsilon after the last
    of them (0 before any), or that the session had no differential privacy."""
    if not enabled:
        return {"enabled": False}
    entry = next((e for e in history if e.get("round") == rounds - 1), None)
    summary = dict(entry["privacy"]) if entry is not None and "privacy" in entry else {"epsilon": 0.0}
    kept = {k: summary[k] for k in ("epsilon", "delta", "budget") if k in summary}
    return {"enabled": True, "rounds": rounds, **kept}


def privacy_units(kind: str, assignments: Sequence[Assignment], contributors: Mapping[int, str] | None) -> list[str]:
    """Whose data each assignment's result is: a data unit (``unit 7``), or for a local task the volunteer the relay
    (or simulator) names per slot in ``contributors``."""
    if kind != "local":
        return [f"unit {a.unit_index}" for a in assignments]
    if contributors is None or any(a.slot not in contributors for a in assignments):
        raise SessionError("a local task's results need their contributors (slot -> peer) for differential privacy")
    return [f"peer {contributors[a.slot]}" for a in assignments]


def settings_of(noise_multiplier: float | None, clip: float | None, quantile: float | None, delta: float,
                budget: float | None) -> PrivacySettings | None:
    """The session's DP settings (None: DP off); a ``SessionError`` for a DP setting given without noise."""
    if noise_multiplier is None:
        given = [name for name, value in (("dp_clip", clip), ("dp_adaptive_clip", quantile),
                                          ("dp_epsilon_budget", budget)) if value is not None]
        if given:
            raise SessionError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} differential privacy's "
                               "noise: set dp_noise_multiplier too (--dp-noise-multiplier Z)")
        return None
    if not math.isfinite(noise_multiplier):
        raise SessionError("dp_noise_multiplier must be finite")
    return PrivacySettings(noise_multiplier, DEFAULT_CLIP if clip is None else clip, quantile, delta, budget)
