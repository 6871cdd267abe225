"""One run of ``peertrain bench attacks``: what the relay offers, its command line, the run and its record.

The verification columns of a record (``verification_columns``) come from the relay's own word: its peer
listing (``GET /api/admin/peers``: ``banned``, ``banned_at``) matched to the roles the bench gave its peers, and
the history's round end times (each entry's ``time``, on the relay's clock like ``banned_at``). A ban's round is
the round open when the ban was written (``ban_round``): the first history entry that ended after it, or the
round after the last one. That is robust where a peer's own observation is not: a banned peer learns of its ban
only at its next request, which may come a round later, or never when the session ends first (the peers'
observation is kept beside it, ``refused_round``, as a cross-check).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from server.bench.attack_peers import Observed, RunSpec, drive
from server.bench.attack_training import Trainer
from server.browser.launcher import relay_process
from server.harness.serve_command import ServeCommand
from server.paths import REPO_ROOT
from server.relay.options import RelayOptions
from server.session.config import SessionConfig

ADMIN = "bench-attacks"
LEASE_SECONDS = 60.0  # a slot held by a peer that went quiet is handed on after this
# "checks off": the relay's switches for the result checks that have one (its flag, where `peertrain serve --help`
# lists it, and the RelayOptions values that turn it off)
CHECKS_OFF: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
    ("--outlier-factor", (("outlier_factor", 0.0),)), ("--no-verify", (("verify", False),)))


@dataclass(frozen=True)
class RelayFeatures:
    flags: frozenset[str]
    default_aggregate: str | None  # the name `peertrain serve --help` gives as --aggregate's default
    default_config: dict[str, Any] | None = None  # and its settings, where the help says them

    @property
    def aggregate(self) -> bool:
        return "--aggregate" in self.flags

    @property
    def proxied(self) -> bool:
        """Whether the relay reads the peers' own addresses from X-Forwarded-For (``serve_command`` sets it up)."""
        return bool({"--forwarded-allow-ips", "--trusted-proxy-header"} & self.flags)


def relay_features() -> RelayFeatures:
    text = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--help"], cwd=REPO_ROOT, check=True,
                          capture_output=True, text=True, timeout=120).stdout
    name, config = default_aggregate(text)
    return RelayFeatures(frozenset(re.findall(r"--[a-z][a-z-]*", text)), name, config)


def default_aggregate(help_text: str) -> tuple[str | None, dict[str, Any] | None]:
    """(``trimmed_mean``, ``{"fraction": 0.33}``) from an options section such as ``--aggregate {mean,...}
    how ... (default trimmed_mean with {"fraction": 0.33}; ...)``; None where the help does not say."""
    options = " ".join(help_text.partition("options:")[2].split())
    match = re.search(r"--aggregate(?![-\w])\s+(?:\{[^}]*\}|[A-Z_]+)\s+(.*?)(?=\s--[a-z]|$)", options)
    found = re.search(r"default:?\s*'?([a-z][a-z_]*)(?:\s+with\s+(\{[^}]*\}))?", match.group(1)) if match else None
    if not found:
        return None, None
    try:
        config = json.loads(found.group(2)) if found.group(2) else None
    except ValueError:
        config = None
    return found.group(1), config if isinstance(config, dict) else None


def aggregator_of(status: dict[str, Any]) -> str | None:
    """The aggregator a relay says it runs (``GET /api/session``'s ``aggregate``)."""
    value = status.get("aggregate")
    if isinstance(value, dict):
        value = value.get("name")
    return value if isinstance(value, str) else None


@dataclass
class RunRecord:
    section: str  # which part of the grid asked for it (the honest runs serve every part with their checks)
    task: str
    aggregator: str  # as asked: a name or "default"
    checks: str  # "on": the relay as shipped; "off": its switchable result checks off (CHECKS_OFF)
    attack: str  # "none" for the honest run
    fraction: float
    attackers: int
    metric: str
    honest_first: int = 0
    value: float | None = None
    initial: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    num_rounds: int = 0
    stopped: str | None = None
    refusals: dict[str, int] = field(default_factory=dict)  # the relay's counters refused.<code>
    counters: dict[str, int] = field(default_factory=dict)  # all of them (bans, replays, freed slots...)
    uploads: dict[str, int] = field(default_factory=dict)  # what the peers saw, by role and outcome
    joins: dict[str, int] = field(default_factory=dict)
    merge_s: float | None = None  # history seconds.merge, mean over rounds (the aggregator's time is in it)
    validate_s: float | None = None
    relay_round_s: float | None = None  # the last upload -> the next round's first assignment, mean
    seconds: float = 0.0
    trained: int = 0
    reused: int = 0
    stalled: bool = False
    peer_seconds: dict[str, float] = field(default_factory=dict)  # where the peers' time went (ask, hold, ...)
    relay_aggregator: str | None = None  # what the relay's status says it ran, with its settings
    relay_aggregator_config: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    vs_honest: float | None = None
    vs_mean: float | None = None
    verify: float | None = None  # host replay share asked for (--verify-fraction; 0: --no-verify); None: the relay's
    attackers_banned: int | None = None  # from the relay's peer listing; None where it could not be read
    ban_rounds: list[int | None] = field(default_factory=list)  # per attacker, the round it was banned in (sorted)
    observed_ban_rounds: list[int | None] = field(default_factory=list)  # the same as the attackers saw it (401/403)
    honest_banned: int | None = None  # must be 0
    honest_ban_reasons: list[str] = field(default_factory=list)
    replay_wait_s: float | None = None  # history verification.waited_seconds, mean over rounds (None: no replays)
    replays: int | None = None  # history verification.results, summed
    wall_round_s: float | None = None  # the session's wall time (first ask -> done) per round
    vs_no_verify: float | None = None  # wall_round_s / that of the same run at share 0
    lies_merged: list[int] = field(default_factory=list)  # per attacker: poisoned results merged (before its ban)

    @property
    def key(self) -> tuple[str, str, str, float | None]:
        """Whose honest run anchors this one: the same task, aggregator, checks and replay share."""
        return self.task, self.aggregator, self.checks, self.verify

    @property
    def variant(self) -> tuple[Any, ...]:
        """The same run at another replay share (whose share-0 run anchors ``vs_no_verify``)."""
        return self.task, self.aggregator, self.checks, self.attack, self.attackers, self.honest_first

    def accepted(self) -> int:
        """The attackers' uploads the relay accepted (for sybil: the admitted sybil joins')."""
        return self.uploads.get(f"{self.attack} accepted", 0)


def serve_command(package: Path, session_dir: Path, k: int, passes: int, aggregator: str, features: RelayFeatures,
                  *, checks: str = "on", configs: dict[str, str] | None = None, verify: float | None = None,
                  replay_engine: str | None = None, extra: Sequence[str] = ()) -> ServeCommand:
    """``peertrain serve`` for one run. min_peers 1: a peer the relay bans must not hold up the next rounds
    (every peer joins before any asks for work, so the first round still goes to all of them). ``verify``: the
    share of results the host replays (``verify_fraction``); 0 is no verification (no replay at all, not even of
    first results); None leaves the relay's default. ``configs``: the aggregators' settings as the bench's user
    typed them (JSON); ``extra``: serve arguments the user typed (``--serve-arg``). A setting whose flag the relay's
    help does not list (``features``) is left at the relay's default."""
    session: dict[str, Any] = {"participants": k, "passes": passes}
    if aggregator != "default":
        session["aggregate"] = aggregator
        if configs and aggregator in configs:
            session["aggregate_config"] = json.loads(configs[aggregator])
    # backup_after None: each peer trains its own unit of a round (backups race stragglers: not measured here)
    relay: dict[str, Any] = {"admin_token": ADMIN, "lease_seconds": LEASE_SECONDS, "peer_timeout": 600.0,
                             "min_peers": 1, "backup_after": None}
    if "--forwarded-allow-ips" in features.flags:  # the bench's peers all connect from 127.0.0.1, its only proxy
        relay["forwarded_allow_ips"] = "127.0.0.1"
    if checks == "off":
        relay |= {name: value for flag, switch in CHECKS_OFF if flag in features.flags for name, value in switch}
    if verify is not None and checks != "off":
        relay |= {"verify": False} if verify <= 0 else {"verify_fraction": verify}
    if replay_engine is not None and "--replay-engine" in features.flags:
        relay["replay_engine"] = replay_engine
    return ServeCommand(package=package, session_dir=session_dir, fresh=True, config=SessionConfig(**session),
                        options=RelayOptions(**relay), extra=tuple(extra))


def one_run(record: RunRecord, spec: RunSpec, serve: ServeCommand, work: Path, trainers: dict[str, Trainer],
            workers: int) -> None:
    """Start the relay with ``serve``, drive the session, fill ``record`` (or its ``error``)."""
    assert serve.session_dir is not None, "a run's session has its own folder"
    session_dir = serve.session_dir
    shutil.rmtree(session_dir, ignore_errors=True)
    started = time.perf_counter()
    try:
        with relay_process(serve, log_path=work / "serve.log") as url:
            spec.url = url.rstrip("/")
            status, observed = drive(spec, trainers, workers)
            rows = audit_rows(spec.url) if spec.attack else []
    except Exception as error:  # a relay that would not start, a refused flag, a broken connection
        record.error = f"{type(error).__name__}: {error}"[:500]
        record.seconds = time.perf_counter() - started
        return
    record.seconds = time.perf_counter() - started
    fill(record, status, observed)
    record.lies_merged = lies_merged(rows, observed.peers, spec.honest_first) if spec.attack != "sybil" else []
    shutil.rmtree(session_dir, ignore_errors=True)


def mean_of(values: list[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


def fill(record: RunRecord, status: dict[str, Any], observed: Observed) -> None:
    history = status.get("history") or []
    final = history[-1]["metrics"] if history else status.get("initial_metrics") or {}
    record.metrics = {k: float(v) for k, v in final.items() if isinstance(v, int | float)}
    record.value = record.metrics.get(record.metric)
    record.initial = (status.get("initial_metrics") or {}).get(record.metric)
    record.rounds, record.num_rounds = len(history), int(status.get("num_rounds") or 0)
    record.stopped = status.get("stopped") or None
    record.counters = {name: int(n) for name, n in (status.get("counters") or {}).items()}
    record.refusals = {name.removeprefix("refused."): n for name, n in record.counters.items()
                       if name.startswith("refused.")}
    record.uploads, record.joins = dict(observed.uploads), dict(observed.joins)
    record.merge_s = mean_of([float(e["seconds"]["merge"]) for e in history if "merge" in e.get("seconds", {})])
    record.validate_s = mean_of([float(e["seconds"]["validate"]) for e in history
                                 if "validate" in e.get("seconds", {})])
    record.relay_round_s = mean_of(observed.round_seconds)
    record.trained, record.reused, record.stalled = observed.trained, observed.reused, observed.stalled
    record.peer_seconds = {step: round(value, 3) for step, value in observed.seconds.items()}
    record.relay_aggregator = aggregator_of(status)
    record.relay_aggregator_config = dict(status.get("aggregate_config") or {})
    if record.attack == "sybil":
        record.attackers = observed.joins.get("sybil admitted", 0)
    verification_columns(record, observed.peers, history)
    record.wall_round_s = observed.session_seconds / record.rounds if record.rounds else None


def ban_round(banned_at: float, history: list[dict[str, Any]]) -> int:
    """The round open at ``banned_at``: that of the first history entry that ended (``time``) after it; past
    the last entry, the round after it (0 with no history)."""
    for entry in history:
        if float(entry.get("time", float("inf"))) >= banned_at:
            return int(entry["round"])
    return int(history[-1]["round"]) + 1 if history else 0


def audit_rows(url: str) -> list[dict[str, Any]]:
    """The relay's audit rows of the results it merged (``GET /api/admin/export/results``): rows of merged rounds
    stay (a ban drops only the open round's; an undo marks them), so they say what reached a merge."""
    response = httpx.get(f"{url}/api/admin/export/results", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    if response.status_code != 200:
        return []
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def lies_merged(rows: list[dict[str, Any]], peers: list[dict[str, Any]], honest_first: int) -> list[int]:
    """Per attacker (in the order of ``peers``), its results that reached a merge after its ``honest_first`` honest
    ones: the poisoned results merged before its ban (whatever an undo did with them afterwards)."""
    return [max(0, sum(1 for row in rows if row.get("peer_id") == peer["peer_id"]) - honest_first)
            for peer in peers if peer["role"] != "honest"]


def verification_columns(record: RunRecord, peers: list[dict[str, Any]], history: list[dict[str, Any]]) -> None:
    """Attackers banned and the round of each ban, honest peers banned (with why), and the replays' cost from
    the history (``verification``: results, waited_seconds), from the relay's peer listing (``peers``, as
    ``attack_peers.peer_listing`` gives it: role, banned, banned_at, ban_reason, refused_round). Without a
    listing (an older relay, no admin token) the ban columns stay None."""
    checks = [e["verification"] for e in history if isinstance(e.get("verification"), dict)]
    record.replay_wait_s = mean_of([float(v["waited_seconds"]) for v in checks if "waited_seconds" in v])
    record.replays = sum(int(v.get("results", 0)) for v in checks) if checks else None
    listed = [p for p in peers if p.get("banned") is not None]
    if not listed:
        return
    attackers = [p for p in listed if p["role"] != "honest"]
    honest = [p for p in listed if p["role"] == "honest"]
    record.attackers_banned = sum(1 for p in attackers if p["banned"])
    rounds = [ban_round(float(p["banned_at"]), history) if p["banned"] and p.get("banned_at") is not None
              else None for p in attackers]
    record.ban_rounds = sorted(rounds, key=lambda r: (r is None, r or 0))
    seen = [p.get("refused_round") for p in attackers]
    record.observed_ban_rounds = sorted(seen, key=lambda r: (r is None, r or 0))
    record.honest_banned = sum(1 for p in honest if p["banned"])
    record.honest_ban_reasons = [str(p.get("ban_reason")) for p in honest if p["banned"]]
