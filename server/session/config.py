"""How a session runs: ``SessionConfig`` (round-trips through JSON), and the checks of a request to change it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

# Centered clipping (radius: twice the round's median distance) equals the mean when every peer is honest and
# bounds what any one result can move; with the host's replays and bans it cost nothing on the honest runs of
# `peertrain bench attacks`, where a trimmed mean (1/3 per side) cost 5-7 points of exact answers on arith.
DEFAULT_AGGREGATE = "centered_clipping"
DEFAULT_AGGREGATE_CONFIG: Mapping[str, Any] = {}
DivergenceAction = Literal["stop", "rollback"]
DIVERGENCE_ACTIONS: tuple[DivergenceAction, ...] = ("stop", "rollback")


class SessionError(ValueError):
    """A session was asked for something its state does not allow; the message says what."""



@dataclass(frozen=True)
class SessionConfig:
    """How a session runs. Round-trips through JSON (``to_json``/``from_json``)."""

    merge: str = "fedavg"
    merge_config: Mapping[str, Any] = field(default_factory=dict)
    # How a round's results become one average before the merge's step (runtime.aggregate).
    aggregate: str = DEFAULT_AGGREGATE
    aggregate_config: Mapping[str, Any] | None = None  # None: the default's settings for the default, else {}
    participants: int = 5  # k, assignments per round
    passes: int = 3  # E, passes over the C units
    seed: int = 0  # chunk order and unit seeds
    max_rounds: int | None = None  # stop early after this many rounds
    force: bool = False  # run a stateful merge even where the guard refuses it
    on_divergence: DivergenceAction = "stop"
    divergence_factor: float = 3.0  # lower-is-better metric above factor * best counts as divergence
    label: str = ""  # how tables and plots name this session (default: the merge name)
    keep_checkpoints: int = 2  # round folders kept on disk besides best/
    # Buffered asynchronous merging (server.session.buffered): "async" merges every k results, each weighted
    # (1 + s) ** -staleness_exponent for its staleness s; validation every validate_every merges.
    mode: str = "sync"
    staleness_exponent: float = 0.5
    max_staleness: int = 20
    validate_every: int = 1

    def __post_init__(self) -> None:
        if self.on_divergence not in DIVERGENCE_ACTIONS:
            raise SessionError(f"on_divergence must be one of {DIVERGENCE_ACTIONS}, got {self.on_divergence!r}")
        if not self.divergence_factor > 1:
            raise SessionError(f"divergence_factor must be > 1, got {self.divergence_factor!r}")
        if self.max_rounds is not None and self.max_rounds < 1:
            raise SessionError(f"max_rounds must be at least 1 (or None), got {self.max_rounds!r}")
        if self.mode not in ("sync", "async"):
            raise SessionError(f"mode must be sync or async, got {self.mode!r}")
        if not self.staleness_exponent >= 0 or self.max_staleness < 0 or self.validate_every < 1:
            raise SessionError("staleness_exponent must be >= 0, max_staleness >= 0 and validate_every >= 1")
        object.__setattr__(self, "merge_config", dict(self.merge_config))
        if self.aggregate_config is None:
            defaults = DEFAULT_AGGREGATE_CONFIG if self.aggregate == DEFAULT_AGGREGATE else {}
            object.__setattr__(self, "aggregate_config", dict(defaults))
        else:
            object.__setattr__(self, "aggregate_config", dict(self.aggregate_config))

    @property
    def name(self) -> str:
        return self.label or self.merge

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SessionError(f"unknown session config field(s) {unknown}")
        if "aggregate" not in data:  # a session stored before aggregators existed ran the weighted mean
            data = {**data, "aggregate": "mean", "aggregate_config": {}}
        return cls(**data)


# What ``POST /api/admin/session`` may change; the package (task, data) stays the relay's.
SETTABLE = ("merge", "merge_config", "aggregate", "aggregate_config", "participants", "passes", "seed", "max_rounds",
            "force", "on_divergence", "divergence_factor", "mode", "staleness_exponent", "max_staleness",
            "validate_every")


def config_from_request(body: Any, current: SessionConfig) -> SessionConfig:
    """The new session's config: ``current`` with the fields ``body`` names replaced (``replace`` is the
    request's own flag, not a setting). Raises ``SessionError`` naming what is wrong."""
    if not isinstance(body, dict):
        raise SessionError("the body must be a JSON object of session settings")
    unknown = sorted(set(body) - set(SETTABLE) - {"replace"})
    if unknown:
        raise SessionError(f"unknown session setting(s) {unknown}; known: {list(SETTABLE)}")
    try:
        changes = {key: body[key] for key in SETTABLE if key in body}
        if "aggregate" in changes and "aggregate_config" not in changes:
            changes["aggregate_config"] = None  # the new aggregator's own defaults, not the old one's settings
        return dataclasses.replace(current, **changes)
    except (TypeError, ValueError) as error:
        raise SessionError(f"bad session settings: {error}") from error
