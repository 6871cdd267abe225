"""Slow and vanishing peers on a virtual clock: the relay's own decisions, in-process, without HTTP.

``simulate_stragglers`` builds a real ``server.relay.state.Relay`` on a ``Store`` whose clock is virtual, adds
peers with ``relay.join`` and runs a discrete-event loop. It drives the relay through the same transport-free API
the HTTP endpoints call: an idle peer asks ``relay.next_work`` (after ``relay.peer``, as every request does, so it
counts as connected); a unit keeps it busy for
``unit_seconds`` times its slowness factor, then it is trained for real (``runtime.peer.Peer``, the module a
browser runs, from the relay's weights message and the unit's chunk) and uploaded with ``relay.submit_result``,
which counts it (a ``Refusal``, ``stale_round`` for a unit whose round merged without it, ``duplicate``..., by its
code). There is no event loop here, so after every event the loop calls ``relay.merge_ready()``, which merges the
way ``Relay.maybe_complete_round`` does (host replays are off here, so nothing to wait for); a round deadline is
an event of its own. Backups, deadlines, leases and "connected" all read the virtual clock through
``store.clock()``, so the relay decides exactly as it would in real time. Merging and validating take no
virtual time (the host's cost is ``peertrain bench relay``'s business).

Waiting peers model the browsers' held requests (``POST /api/work?hold=S``): woken at once when the relay's
work changes (a merge, a freed slot), else asking again after the relay's ``retry`` seconds, or after
``hold_seconds`` where set (what a browser does: its held request ends after ``hold_seconds``, 15 s by default).
Nothing wakes a held request when a unit crosses the backup threshold, so a browser sees the backup only when
its hold ends: ``hold_seconds=15`` shows what that costs. Each request reaches
the relay after a seeded latency of up to ``latency`` seconds, which breaks the ties a virtual clock would
otherwise make (whose lease is oldest, who asks first after a merge).

Peer speeds (``PROFILES``): ``equal`` (every factor 1), ``one-slow:F`` (the first peer to join is F times
slower, default 4), ``lognormal:S`` (factors exp(N(0, S)), seeded, default 0.5) and ``dropout:P`` (every peer at
speed 1; max(1, round(P n)) seeded peers vanish once, in the middle of a unit chosen by the seed, and come back
``away_seconds`` later (default: one lease) as the same peer; their lease is left to expire).

Identical trainings are memoized (``TrainingMemo``: the weights message's digest, the round, the slot and the
unit, which fix the result's bytes); a unit whose round has merged is not trained at all: its upload is refused
on its round before the relay reads the body.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.peer import Peer
from runtime.protocol import Done, Job, Wait
from server.relay.options import DEFAULT_BACKUP_AFTER, RelayOptions
from server.relay.refusal import Refusal
from server.relay.state import Relay
from server.relay.store import open_store
from server.session.metrics import RoundLog
from server.session.package import Package
from server.session.session import Session, SessionConfig

PROFILES = {"equal": None, "one-slow": 4.0, "lognormal": 0.5, "dropout": 0.2}  # name -> default parameter
ADMIN_TOKEN = "stragglers"
DEFAULT_UNIT_SECONDS = 10.0
DEFAULT_LATENCY = 0.05  # seconds: a request's way to the relay, drawn per request from U(0, latency)
MEMO_BYTES = 768 << 20
TARGET_RTOL = 1e-5  # a validation this close to the target (relative) reaches it


@dataclass(frozen=True)
class Profile:
    """How fast each peer is (``--peer-speeds``)."""

    name: str
    value: float | None = None

    @property
    def text(self) -> str:
        return self.name if self.value is None else f"{self.name}:{self.value:g}"

    def factors(self, peers: int, seed: int) -> list[float]:
        """Each peer's slowness: a unit takes ``unit_seconds`` times this."""
        if self.name == "one-slow":
            return [float(self.value or 1.0)] + [1.0] * (peers - 1)
        if self.name == "lognormal":
            rng = np.random.default_rng([seed, 1])
            return [float(f) for f in np.exp(rng.normal(0.0, float(self.value or 0.0), peers))]
        return [1.0] * peers

    def dropouts(self, peers: int, seed: int) -> list[int]:
        """The peers that vanish once (``dropout:P``)."""
        if self.name != "dropout" or not self.value:
            return []
        count = min(peers, max(1, round(self.value * peers)))
        return sorted(random.Random(f"dropout-{seed}").sample(range(peers), count))


def parse_profile(text: str) -> Profile:
    """``equal``, ``one-slow[:F]``, ``lognormal[:S]`` or ``dropout[:P]``; a ValueError says what is wrong."""
    name, sep, raw = text.strip().partition(":")
    if name not in PROFILES:
        raise ValueError(f"unknown peer-speed profile {text!r}; choose {', '.join(PROFILES)} (e.g. one-slow:4)")
    if name == "equal":
        if sep:
            raise ValueError("the equal profile takes no parameter")
        return Profile(name)
    try:
        value = float(raw) if sep else float(PROFILES[name] or 0.0)
    except ValueError:
        raise ValueError(f"peer-speed profile {text!r}: {raw!r} is not a number") from None
    if name == "one-slow" and not value >= 1:
        raise ValueError(f"one-slow:F needs F >= 1 (how many times slower), not {raw}")
    if name == "lognormal" and not 0 <= value < math.inf:
        raise ValueError(f"lognormal:S needs a spread S >= 0, not {raw}")
    if name == "dropout" and not 0 < value <= 1:
        raise ValueError(f"dropout:P needs a share P in (0, 1], not {raw}")
    return Profile(name, value)


@dataclass
class StragglerSettings:
    """One simulated session's peers and the relay's options that pace rounds."""

    profile: Profile = field(default_factory=lambda: Profile("equal"))
    peers: int | None = None  # default: k
    unit_seconds: float = DEFAULT_UNIT_SECONDS  # a unit's virtual time on a peer of factor 1
    backup_after: float | None = DEFAULT_BACKUP_AFTER  # None: no backups
    round_deadline: float | None = None  # virtual seconds
    min_results: int | None = None
    lease_seconds: float = 120.0
    peer_timeout: float = 30.0
    retry_seconds: float = 1.0
    hold_seconds: float | None = None  # a waiting peer asks again after this (browsers: 15) instead of the retry
    away_seconds: float | None = None  # dropout: how long a vanished peer stays away (None: lease_seconds)
    latency: float = DEFAULT_LATENCY
    seed: int = 0
    max_virtual_seconds: float | None = None  # give up (stalled) past this; default: generous
    relay_options: dict[str, Any] = field(default_factory=dict)  # more RelayOptions fields (a relay mode, ...)

    def options(self) -> RelayOptions:
        return RelayOptions(admin_token=ADMIN_TOKEN, verify=False, ban_addresses=False, backup_after=self.backup_after,
                            round_deadline=self.round_deadline, min_results=self.min_results,
                            lease_seconds=self.lease_seconds, peer_timeout=self.peer_timeout,
                            retry_seconds=self.retry_seconds, **self.relay_options)


class TrainingMemo:
    """Result messages by what fixes their bytes (the round's weights message, round, slot, unit, seed,
    progress): training is deterministic (the relay's copy comparison relies on it), so a unit met again, as a
    backup, or in another run of a bench with the same weights, is trained once. Least recently used go first."""

    def __init__(self, max_bytes: int = MEMO_BYTES) -> None:
        self.max_bytes, self.bytes = max_bytes, 0
        self.kept: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self.hits = self.trained = 0

    def get(self, key: tuple[Any, ...], train: Callable[[], bytes]) -> bytes:
        body = self.kept.get(key)
        if body is not None:
            self.kept.move_to_end(key)
            self.hits += 1
            return body
        body = train()
        self.trained += 1
        self.kept[key] = body
        self.bytes += len(body)
        while self.bytes > self.max_bytes and len(self.kept) > 1:
            self.bytes -= len(self.kept.popitem(last=False)[1])
        return body


@dataclass
class StragglerRun:
    """What one simulated session did, in virtual seconds from the first request."""

    profile: str
    factors: list[float]
    dropouts: list[int]
    metric: str
    higher_is_better: bool
    timeline: list[tuple[float, float | None]]  # (virtual time, validated metric): initial, then each merge
    virtual_seconds: float  # the session's wall time: its last merge
    rounds: int
    planned_rounds: int
    done: bool  # False: stalled or cut off
    backups_handed_out: int
    backups_won: int
    units_carried: int
    units_done: int  # units peers finished and uploaded (copies and late ones included)
    units_merged: int
    refused: dict[str, int]
    counters: dict[str, int]
    real_seconds: float
    trained: int  # trainings actually computed (the rest: memo hits or skipped stale units)
    weights: np.ndarray = field(repr=False)
    history: list[dict[str, Any]] = field(repr=False, default_factory=list)

    @property
    def final_metric(self) -> float | None:
        values = [value for _, value in self.timeline if value is not None]
        return values[-1] if values else None

    def time_to(self, target: float | None) -> float | None:
        """Virtual time of the first validation at or past ``target``, within ``TARGET_RTOL`` (the same results
        merged in another order differ in the last bits); None: never."""
        if target is None:
            return None
        slack = abs(target) * TARGET_RTOL
        for at, value in self.timeline:
            if value is not None and (value >= target - slack if self.higher_is_better else value <= target + slack):
                return at
        return None

    def metric_at(self, budget: float) -> float | None:
        """The metric of the last validation within ``budget`` virtual seconds."""
        values = [value for at, value in self.timeline if at <= budget + 1e-9 and value is not None]
        return values[-1] if values else None

    def summary(self) -> dict[str, Any]:
        return {"profile": self.profile, "factors": self.factors, "dropouts": self.dropouts, "metric": self.metric,
                "timeline": self.timeline, "virtual_seconds": self.virtual_seconds, "rounds": self.rounds,
                "planned_rounds": self.planned_rounds, "done": self.done, "final_metric": self.final_metric,
                "backups_handed_out": self.backups_handed_out, "backups_won": self.backups_won,
                "units_carried": self.units_carried, "units_done": self.units_done, "units_merged": self.units_merged,
                "refused": self.refused, "real_seconds": self.real_seconds, "trained": self.trained}


@dataclass
class SimPeer:
    index: int
    peer_id: str
    token: str
    factor: float
    state: str = "idle"  # idle (a request is on its way), waiting, busy, away, done
    generation: int = 0  # a poll event of an older generation is dropped
    job: Job | None = None
    units: int = 0
    drop_at_unit: int | None = None  # vanish during this unit (counted from 1)


class StragglerSimulation:
    """The event loop of one session; ``simulate_stragglers`` builds and runs it."""

    def __init__(self, package: Package, config: SessionConfig, settings: StragglerSettings, work_dir: Path, *,
                 session_dir: Path | None = None, memo: TrainingMemo | None = None,
                 on_round: Callable[[dict[str, Any], float, StragglerSimulation], Any] | None = None,
                 round_log: RoundLog | None = None) -> None:
        self.now = 0.0
        self.settings, self.package, self.on_round = settings, package, on_round
        self.memo = memo if memo is not None else TrainingMemo()
        store_path = Path(work_dir) / "relay.sqlite3"
        for leftover in (store_path, store_path.with_name(store_path.name + "-wal"),
                         store_path.with_name(store_path.name + "-shm")):
            leftover.unlink(missing_ok=True)
        store = open_store(store_path, clock=self.clock, durable=False)  # a simulation's file needs no durability
        session = Session.create(package, config, directory=session_dir, round_log=round_log)
        self.relay = Relay(session=session, package=package, store=store, options=settings.options())
        count = settings.peers or session.plan.participants_per_round
        factors = settings.profile.factors(count, settings.seed)
        self.peers = []
        for index, factor in enumerate(factors):
            peer_id, token = self.relay.join(f"10.0.{index // 250}.{index % 250 + 1}", agent=f"simulated peer {index}")
            self.peers.append(SimPeer(index, peer_id, token, factor))
        self.dropouts = settings.profile.dropouts(count, settings.seed)
        rng = random.Random(f"units-{settings.seed}")
        expected = max(1, len(session.plan.schedule) // count)
        for index in self.dropouts:
            self.peers[index].drop_at_unit = rng.randint(1, max(1, expected // 2))
        self.rng = random.Random(f"latency-{settings.seed}")
        self.trainer = Peer(package.task_description())
        self.events: list[tuple[float, int, str, int]] = []
        self.sequence = 0
        self.deadlines: set[int] = set()
        self.timeline: list[tuple[float, float | None]] = [(0.0, session.metric_series()[0])]
        self.last_merge = 0.0
        self.refused: dict[str, int] = {}
        self.units_done = 0
        self._trained_from = ""  # the digest of the weights message the trainer holds
        self._work_event = self.relay.notices.work_generation
        self._trained_before = self.memo.trained

    def clock(self) -> float:
        return self.now

    # -- events ----------------------------------------------------------------------------------
    def push(self, at: float, kind: str, peer: int = -1) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (at, self.sequence, kind, peer))

    def ask(self, peer: SimPeer, at: float) -> None:
        """``peer`` sends a work request, which reaches the relay after a seeded latency."""
        peer.state, peer.generation = "idle", peer.generation + 1
        self.push(at + self.rng.uniform(0.0, self.settings.latency), f"poll:{peer.generation}", peer.index)

    def run(self) -> StragglerRun:
        started = time.perf_counter()
        session = self.relay.session
        limit = self.settings.max_virtual_seconds or self.default_limit()
        for each in self.peers:
            self.ask(each, 0.0)
        while self.events and not session.done:
            at, _, kind, index = heapq.heappop(self.events)
            if at > limit:
                break
            self.now = max(self.now, at)
            peer = self.peers[index] if index >= 0 else None
            if kind.startswith("poll:") and peer is not None:
                if peer.state in ("idle", "waiting") and kind == f"poll:{peer.generation}":
                    self.poll(peer)
            elif kind == "finish" and peer is not None:
                self.finish(peer)
            elif kind == "vanish" and peer is not None:
                peer.state, peer.job = "away", None
                self.push(self.now + self.away_seconds(), "return", peer.index)
            elif kind == "return" and peer is not None:
                self.ask(peer, self.now)
            self.merge_if_ready()
            self.wake_if_work_changed()
        return self.result(time.perf_counter() - started)

    def default_limit(self) -> float:
        """Stalled past this: every planned round at the slowest peer's pace, plus a lease each, twice over."""
        slowest = max(p.factor for p in self.peers) * self.settings.unit_seconds
        rounds = self.relay.session.num_rounds
        away = self.away_seconds() if math.isfinite(self.away_seconds()) else 0.0  # (inf: never back)
        return 2 * rounds * (slowest + self.settings.lease_seconds + (self.settings.round_deadline or 0.0)) + 2 * away

    def away_seconds(self) -> float:
        away = self.settings.away_seconds
        return self.settings.lease_seconds if away is None else away

    def poll(self, peer: SimPeer) -> None:
        """``POST /api/work``: authenticate (connected), merge a ready round, ask for an assignment."""
        relay = self.relay
        relay.peer(peer.peer_id, peer.token)
        self.merge_if_ready()
        job = relay.next_work(peer.peer_id)
        if isinstance(job, Done):
            peer.state = "done"
            return
        if isinstance(job, Wait):
            peer.state = "waiting"
            peer.generation += 1
            again = self.settings.hold_seconds or job.wait
            self.push(self.now + again + self.rng.uniform(0.0, self.settings.latency), f"poll:{peer.generation}",
                      peer.index)
            return
        peer.state, peer.job = "busy", job
        peer.units += 1
        seconds = self.settings.unit_seconds * peer.factor
        if peer.drop_at_unit == peer.units:
            peer.drop_at_unit = None
            self.push(self.now + seconds * self.rng.uniform(0.1, 0.9), "vanish", peer.index)
        else:
            self.push(self.now + seconds, "finish", peer.index)
        self.watch_deadline()

    def finish(self, peer: SimPeer) -> None:
        """``POST /api/result``: train the unit (unless its round is gone), upload it, then ask for more."""
        relay, job = self.relay, peer.job
        assert job is not None
        relay.peer(peer.peer_id, peer.token)
        self.units_done += 1
        message = self.weights_for(job)
        body = self.train(job, message) if message is not None else b""  # refused before the body is read
        try:
            relay.submit_result(peer.peer_id, job.round, job.slot, body)
        except Refusal as refusal:  # (counted by the relay; kept here by code for the run's record)
            self.refused[refusal.code] = self.refused.get(refusal.code, 0) + 1
        peer.job = None
        self.merge_if_ready()
        self.ask(peer, self.now)

    def weights_for(self, job: Job) -> bytes | None:
        """The weights message the job was handed out with (``GET /api/weights?round=V``), or None where the
        relay no longer keeps them: the round merged (sync), the version is past the staleness bound (async)."""
        relay = self.relay
        version = job.weights_round
        if relay.session.done:
            return None
        if version == relay.session.round:
            return relay.weights_message()
        return relay.weights_of(version)

    def train(self, job: Job, message: bytes) -> bytes:
        trainer = self.trainer
        key = (hashlib.sha256(message).hexdigest(), job.round, job.slot, job.unit_index, job.unit_seed, job.episodes,
               job.progress)

        def compute() -> bytes:
            header_round = job.weights_round
            if trainer.weights_round != header_round or self._trained_from != key[0]:
                trainer.set_weights(message)
                self._trained_from = key[0]
            unit = self.package.chunk_bytes(job.unit_index) if job.kind == "data" else None
            return trainer.train(job, unit)

        return self.memo.get(key, compute)

    def watch_deadline(self) -> None:
        """After a round's first hand-out: an event at its deadline (the relay's ``watch_deadline``)."""
        deadline, relay = self.settings.round_deadline, self.relay
        round_index = relay.session.round
        opened = relay.pacing.round_opened_at()
        if deadline is None or opened is None or round_index in self.deadlines:
            return
        self.deadlines.add(round_index)
        self.push(opened + deadline + 1e-6, "deadline")

    def merge_if_ready(self) -> None:
        """``relay.merge_ready()``: what ``Relay.maybe_complete_round`` does when the round (or, in async mode, the
        buffer) is ready, inline: no replays to wait for (verification is off), no samples (there is no page)."""
        relay = self.relay
        for entry in relay.merge_ready():
            self.last_merge = self.now
            self.timeline.append((self.now, entry["metrics"].get(relay.session.metric)))
            if self.on_round is not None:
                self.on_round(entry, self.now, self)

    def wake_if_work_changed(self) -> None:
        """A held request answers the moment the relay's work changes: wake every waiting peer."""
        event = self.relay.notices.work_generation
        if event is self._work_event:
            return
        self._work_event = event
        for peer in self.peers:
            if peer.state == "waiting":
                self.ask(peer, self.now)

    # -- the record ----------------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        return self.relay.store.counters()

    def result(self, real_seconds: float) -> StragglerRun:
        relay, session = self.relay, self.relay.session
        counters = self.counters()
        history = session.history
        run = StragglerRun(
            profile=self.settings.profile.text, factors=[p.factor for p in self.peers], dropouts=self.dropouts,
            metric=session.metric, higher_is_better=session.task.higher_is_better, timeline=self.timeline,
            virtual_seconds=self.last_merge, rounds=session.round, planned_rounds=session.plan.num_rounds,
            done=session.done, backups_handed_out=counters.get("backups_handed_out", 0),
            backups_won=counters.get("backups_won", 0),
            units_carried=sum(len(e.get("carried", [])) for e in history), units_done=self.units_done,
            units_merged=sum(int(e["participants"]) for e in history), refused=dict(sorted(self.refused.items())),
            counters=counters, real_seconds=real_seconds, trained=self.memo.trained - self._trained_before,
            weights=session.weights.copy(), history=list(history))
        relay.close()
        return run


def simulate_stragglers(package: Package, config: SessionConfig, settings: StragglerSettings, work_dir: Path, *,
                        session_dir: Path | None = None, memo: TrainingMemo | None = None,
                        on_round: Callable[[dict[str, Any], float, StragglerSimulation], Any] | None = None,
                        round_log: RoundLog | None = None) -> StragglerRun:
    """One session on ``package`` with ``config``, its peers and relay options from ``settings``; the relay's
    SQLite file goes in ``work_dir``, checkpoints in ``session_dir`` (None: none). ``on_round(entry, virtual
    time, simulation)`` after each merge; ``round_log``: where its rounds go besides the history (with a
    ``session_dir``: ``server.session.metrics``)."""
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    return StragglerSimulation(package, config, settings, work_dir, session_dir=session_dir, memo=memo,
                               on_round=on_round, round_log=round_log).run()
