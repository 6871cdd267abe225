"""How a session runs: ``SessionConfig`` (round-trips through JSON), and the checks of a request to change it."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from runtime import codecs
from runtime.codecs import DEFAULT_TOPK_FRACTION, Codec
from server.session.privacy import PrivacySettings, check_aggregator, settings_of
from server.session.settings import SessionError, check, check_fields, declared, json_schema, setting

AUTO_CODEC = "auto"  # the task's default_codec


class CodecChoices:
    """What ``--codec`` takes: ``auto`` and every registered codec's name (``runtime.codecs.names``), read each time a
    value is checked, so a codec registered after this module was imported is a choice too."""

    def __iter__(self) -> Iterator[str]:
        return iter((AUTO_CODEC, *codecs.names()))


CODEC_CHOICES = CodecChoices()

# Centered clipping (radius: twice the round's median distance) equals the mean when every peer is honest and
# bounds what any one result can move; with the host's replays and bans it cost nothing on the honest runs of
# `peertrain bench attacks`, where a trimmed mean (1/3 per side) cost 5-7 points of exact answers on arith.
DEFAULT_AGGREGATE = "centered_clipping"
DEFAULT_AGGREGATE_CONFIG: Mapping[str, Any] = {}
DivergenceAction = Literal["stop", "rollback"]
DIVERGENCE_ACTIONS: tuple[DivergenceAction, ...] = ("stop", "rollback")
# (SessionError is defined in server.session.settings, whose checks raise it, and read from here as before.)



def merge_memory_bytes() -> int:
    """What a merge may hold at once: half this machine's physical memory (the aggregators that need every result
    at once are refused past it: ``runtime.aggregate.base.fit_refusal``)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) // 2
    except (ValueError, OSError, AttributeError):  # (a system that does not say: 8 GiB)
        return 8 * 2**30

@dataclass(frozen=True)
class SessionConfig:
    """How a session runs. Round-trips through JSON (``to_json``/``from_json``). Each field declares its setting
    (``server.session.settings``): the flags of ``serve`` and ``simulate``, the admin API's schema and the check
    of a value all come from here."""

    merge: str = field(default="fedavg", metadata=setting(
        help="the merge method", registry="runtime.merge:MERGES", commands=("serve",), admin=True))
    merge_config: Mapping[str, Any] = field(default_factory=dict, metadata=setting(
        help='merge hyperparameters as JSON, e.g. {"eta": 0.01}', metavar="JSON", commands=("serve",), admin=True))
    # How a round's results become one average before the merge's step (runtime.aggregate).
    aggregate: str = field(default=DEFAULT_AGGREGATE, metadata=setting(
        help="how a round's results become one average before the merge's step (mean: plain FedAvg); median, "
        "trimmed_mean, krum and multikrum hold every result of a round at once (16 bytes a weight a result): a "
        "session past half this machine's memory with them is refused",
        registry="runtime.aggregate:AGGREGATORS", admin=True,
        default_text=DEFAULT_AGGREGATE + (f" with {json.dumps(DEFAULT_AGGREGATE_CONFIG)}" if DEFAULT_AGGREGATE_CONFIG
                                          else "")))
    # None: the default's settings for the default aggregator, else {}
    aggregate_config: Mapping[str, Any] | None = field(default=None, metadata=setting(
        help='the aggregator\'s settings as JSON, e.g. {"fraction": 0.2} or {"f": 2}', metavar="JSON",
        default_text="its own defaults", admin=True))
    participants: int = field(default=5, metadata=setting(
        help="k: assignments per round (async: results per merge)", short="-k", minimum=1, metavar="K", admin=True,
        command_defaults={"serve": (3, "3 units a round suit a person with a few tabs and `make demo`'s headless "
                                       "peers (one peer alone trains them in turn); simulate trains them all itself")},
        default_text="5, or the package's units if fewer"))
    passes: int = field(default=3, metadata=setting(
        help="E: passes over the work units", minimum=1, metavar="E", admin=True))
    seed: int = field(default=0, metadata=setting(
        help="seed of the chunk order and the unit seeds (and of the initial weights of a package built here)",
        minimum=0, metavar="N", admin=True))
    max_rounds: int | None = field(default=None, metadata=setting(
        help="stop early after this many rounds", aliases=("--rounds",), minimum=1, metavar="N",
        default_text="all planned rounds", admin=True))
    force: bool = field(default=False, metadata=setting(
        help="run a stateful server optimizer (FedAvgM, FedAdam, FedYogi, FedAdagrad) even where the guard refuses "
        "it (a round covers a large share of the data)", admin=True))
    on_divergence: DivergenceAction = field(default="stop", metadata=setting(
        help="on a non-finite or exploding validation metric: stop, or restore the best weights", admin=True))
    divergence_factor: float = field(default=3.0, metadata=setting(
        help="a lower-is-better metric above this many times the best so far counts as divergence", above=1,
        metavar="F", admin=True))
    label: str = field(default="", metadata=setting(
        help="how tables and plots name this session", metavar="NAME", default_text="the merge name",
        commands=("serve",)))
    keep_checkpoints: int = field(default=2, metadata=setting(
        help="round folders kept on disk besides best/", minimum=1, metavar="N", commands=("serve",)))
    # Buffered asynchronous merging (server.session.buffered): "async" merges every k results, each weighted
    # (1 + s) ** -staleness_exponent for its staleness s; validation every validate_every merges.
    mode: str = field(default="sync", metadata=setting(
        help="sync: rounds of k units; async: buffered asynchronous merging (FedBuff), peers never wait for a "
        "round and every --buffer results are merged", choices=("sync", "async"), group="async", admin=True))
    staleness_exponent: float = field(default=0.5, metadata=setting(
        help="async: a result s versions behind is weighted (1 + s) ** -A", minimum=0, metavar="A", group="async",
        admin=True))
    max_staleness: int = field(default=20, metadata=setting(
        help="async: a result more than S versions behind is refused (409 too_stale)", minimum=0, metavar="S",
        group="async", admin=True))
    validate_every: int = field(default=1, metadata=setting(
        help="async: validate (and plot) every N merges", minimum=1, metavar="N", group="async", admin=True))

    # How a result travels (runtime.codecs): the weights, or the update against the weights handed out, compressed.
    codec: str = field(default=AUTO_CODEC, metadata=setting(
        help="how a result travels: none (float32 weights), int8 (its update: an int8 per entry, a scale per 256) "
        "or topk (the largest --topk-fraction of each block of its update, int8, with error feedback), or another "
        "codec registered in runtime.codecs; merged steps travel down the same way; auto: the task's default "
        "(docs/sessions/relay.md, \"Compressed results\")", registry="server.session.config:CODEC_CHOICES", admin=True))
    topk_fraction: float = field(default=DEFAULT_TOPK_FRACTION, metadata=setting(
        help="topk: the share of each block's entries a result sends", above=0, maximum=1, what="a share",
        metavar="F", admin=True))

    # User-level differential privacy (server.session.privacy, docs/sessions/privacy.md): each update clipped,
    # the clipped updates averaged, Gaussian noise added; epsilon from Google's dp-accounting after every round.
    dp_noise_multiplier: float | None = field(default=None, metadata=setting(
        help="differential privacy: each round adds Gaussian noise of Z times the clip to the sum of the clipped "
        "updates (DP-FedAvg); the page shows epsilon after every round", above=0, metavar="Z",
        default_text="off: no differential privacy", group="privacy", admin=True))
    dp_clip: float | None = field(default=None, metadata=setting(
        help="differential privacy: the L2 norm each update is clipped to (with --dp-adaptive-clip, its first value)",
        above=0, metavar="C", default_text="1", group="privacy", admin=True))
    dp_adaptive_clip: float | None = field(default=None, metadata=setting(
        help="differential privacy: the clip follows this quantile of the update norms, itself counted with noise "
        "(Andrew et al. 2021)", above=0, maximum=1, what="a share", metavar="QUANTILE",
        default_text="off: the clip stays", group="privacy", admin=True))
    dp_delta: float = field(default=1e-6, metadata=setting(
        help="differential privacy: the delta epsilon is given at (well below 1 / the number of people)", above=0,
        maximum=0.01, metavar="DELTA", group="privacy", admin=True))
    dp_epsilon_budget: float | None = field(default=None, metadata=setting(
        help="differential privacy: the session stops before a round that would take epsilon past this",
        above=0, metavar="EPSILON", default_text="none", group="privacy", admin=True))

    def __post_init__(self) -> None:
        check_fields(self)
        if privacy_settings(self) is not None:
            check_aggregator(self.aggregate)
            if self.mode == "async":
                raise SessionError("differential privacy composes rounds of clipped updates; async mode's staleness "
                                   "weights change each update's share, so it is not offered with --mode async "
                                   "(settings mode, dp_noise_multiplier)")
        object.__setattr__(self, "merge_config", dict(self.merge_config))
        if self.aggregate_config is None:
            defaults = DEFAULT_AGGREGATE_CONFIG if self.aggregate == DEFAULT_AGGREGATE else {}
            object.__setattr__(self, "aggregate_config", dict(defaults))
        else:
            object.__setattr__(self, "aggregate_config", dict(self.aggregate_config))

    @property
    def name(self) -> str:
        return self.label or self.merge

    @property
    def result_codec(self) -> Codec:
        """The codec results travel in (``runtime.codecs``, found by name in its registry; a codec reads the settings
        it takes: topk its fraction); ``auto`` is the task's, decided by ``Session`` (or by
        ``server.session.rules.resolve``, which knows whether replays compare results): read it from a session's
        config."""
        if self.codec == AUTO_CODEC:
            raise SessionError("codec 'auto' is resolved by the session (the task's default_codec): read "
                               "session.config.result_codec")
        return codecs.from_json({"name": self.codec, "fraction": self.topk_fraction})

    def with_codec_for(self, default_codec: str, *, compares: bool) -> SessionConfig:
        """This config with ``auto`` replaced by a task's ``default_codec``, or by that codec's ``compared_fallback``
        when replays or copies compare results and its results cannot be compared (topk's residual: int8)."""
        if self.codec != AUTO_CODEC:
            return self
        chosen = dataclasses.replace(self, codec=default_codec)
        codec = chosen.result_codec
        return dataclasses.replace(self, codec=codec.compared_fallback) if compares and not codec.comparable else chosen

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


def privacy_settings(config: SessionConfig) -> PrivacySettings | None:
    """The session's DP settings (None: off); a ``SessionError`` for a DP setting given without the noise."""
    return settings_of(config.dp_noise_multiplier, config.dp_clip, config.dp_adaptive_clip, config.dp_delta,
                       config.dp_epsilon_budget)


# What ``POST /api/admin/session`` may change (the fields declared ``admin=True``); the package (task, data) stays
# the relay's.
SETTABLE = tuple(name for name, item in declared(SessionConfig).items() if item.setting.admin)


def config_from_request(body: Any, current: SessionConfig) -> SessionConfig:
    """The new session's config: ``current`` with the fields ``body`` names replaced (``replace`` is the
    request's own flag, not a setting). Raises ``SessionError`` naming what is wrong (``SettingError`` for a
    refused value: the words a flag or a config file would get)."""
    if not isinstance(body, dict):
        raise SessionError("the body must be a JSON object of session settings")
    unknown = sorted(set(body) - set(SETTABLE) - {"replace"})
    if unknown:
        raise SessionError(f"unknown session setting(s) {unknown}; known: {list(SETTABLE)}")
    items = declared(SessionConfig)
    changes = {key: check(items[key], body[key]) for key in SETTABLE if key in body}
    if "aggregate" in changes and "aggregate_config" not in changes:
        changes["aggregate_config"] = None  # the new aggregator's own defaults, not the old one's settings
    try:
        return dataclasses.replace(current, **changes)
    except (TypeError, ValueError) as error:
        if isinstance(error, SessionError):
            raise
        raise SessionError(f"bad session settings: {error}") from error


def session_request_schema() -> dict[str, dict[str, object]]:
    """The JSON-schema properties of a ``POST /api/admin/session`` body: every ``SETTABLE`` setting as declared
    (type, bounds, choices, help), and the request's own ``replace`` flag."""
    return {**json_schema(SessionConfig, SETTABLE),
            "replace": {"type": "boolean", "description": "replace a session that is still running"}}
