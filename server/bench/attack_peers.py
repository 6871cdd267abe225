"""Attacker peers for ``peertrain bench attacks``: the poisoned uploads' maths, and native peers that drive one
session of a real relay over HTTP.

Every peer, honest or not, is the one Python peer (``server.harness.peer.RelayPeer``) over its own ``httpx.Client``
(its own client address, sent in ``PROXY_HEADER`` for a relay started with ``--forwarded-allow-ips 127.0.0.1``),
driven step by step in lock-step passes: join, ask for work, fetch the global weights (again when a job names others,
as after a ban's undo) and the unit's chunk; the pass's units train at once (``attack_training``: the code a
browser's worker runs, natively or on the browser's own engine); every peer uploads. An attacker trains honestly too
and then its hooks (``Attacker``) replace its upload (``poisoned``); everything else it does is honest. Nothing here
is a flag of the product: the relay sees clients and nothing else.

The uploads (g: the round's global weights, w: the attacker's honestly trained weights, u = w - g):

* ``noise_claim``: g + N(0, 0.05) per weight, claiming ``num_examples`` = 1e9;
* ``flip``: g - 4 u;
* ``free_rider``: g unchanged;
* ``scaled``: g + 1.5 u + N(0, 0.01);
* ``little_is_enough`` (Baruch et al. 2019, "A Little Is Enough: Circumventing Defenses For Distributed
  Learning"): the attackers collude; each uploads g + mean(u) - z std(u), per coordinate, over the honest
  updates the attackers computed in this round (their estimate of the benign updates; std with ddof 0).
  z is fixed (1.0 by default) or the paper's ``z_max`` for n peers and f attackers (``paper_z``);
* ``inner_product`` (Xie et al. 2020, inner-product manipulation): g - 0.5 u, half an honest norm, pointing back;
* ``sybil``: one client address joins ``sybil_joins`` extra times beside the k honest peers; the joins the
  relay admits ask for work like everyone (each pass over the peers goes in a shuffled order: who asks first
  gets the slot) and upload ``flip``. The refused joins are counted by code.

After a session, ``drive`` reads the relay's ``GET /api/admin/peers`` (with the run's admin token) and keeps,
per peer it ran, its role, ``banned``, ``ban_reason`` and ``banned_at``, and the round in which the peer itself
was first refused with 401/403 (``Observed.peers``), for the bench's verification columns.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import httpx
import numpy as np

from runtime import wire
from runtime.codecs import Codec, NoneCodec
from runtime.codecs import from_json as codec_from_json
from runtime.protocol import Done, Job, Wait, WorkAnswer
from server.bench.attack_training import Trainer, bench_trainer, peer_engine
from server.harness.peer import (
    Fetched,
    PeerHooks,
    Refused,
    RelayPeer,
    RetryPolicy,
    Steps,
    SyncTransport,
    WeightsFrom,
    pooled,
)
from server.relay.client import RelayClient

UPLOAD_ATTACKS = ("noise_claim", "flip", "free_rider", "scaled", "little_is_enough", "inner_product")
ATTACKS = (*UPLOAD_ATTACKS, "sybil")
CLAIMED_EXAMPLES = 10**9
NOISE_STD = 0.05
FLIP_FACTOR = 4.0
SCALE_FACTOR = 1.5
SCALED_NOISE_STD = 0.01
INNER_PRODUCT_EPS = 0.5
SYBIL_UPLOAD = "flip"  # what an admitted sybil peer uploads
PROXY_HEADER = "X-Forwarded-For"
SYBIL_ADDRESS = "10.66.0.1"
JOIN_RETRIES = 5  # an honest peer refused with 429 waits Retry-After (at most MAX_RETRY_AFTER) and tries again
MAX_RETRY_AFTER = 5.0
MAX_PASSES = 20_000  # passes over the peers in one run (each pass makes at least one request)


# ---------------------------------------------------------------- the uploads' maths


def update(global_weights: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return weights.astype(np.float64) - global_weights.astype(np.float64)


def flip(global_weights: np.ndarray, honest: np.ndarray) -> np.ndarray:
    """g - 4 (w - g)."""
    g = global_weights.astype(np.float64)
    return (g - FLIP_FACTOR * update(global_weights, honest)).astype(np.float32)


def free_rider(global_weights: np.ndarray) -> np.ndarray:
    return np.array(global_weights, dtype=np.float32, copy=True)


def noise(global_weights: np.ndarray, rng: np.random.Generator, std: float = NOISE_STD) -> np.ndarray:
    """g + N(0, std) per weight (uploaded with a claim of CLAIMED_EXAMPLES examples)."""
    return (global_weights.astype(np.float64) + rng.normal(0.0, std, global_weights.shape)).astype(np.float32)


def scaled(global_weights: np.ndarray, honest: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """g + 1.5 (w - g) + N(0, 0.01)."""
    moved = global_weights.astype(np.float64) + SCALE_FACTOR * update(global_weights, honest)
    return (moved + rng.normal(0.0, SCALED_NOISE_STD, global_weights.shape)).astype(np.float32)


def inner_product(global_weights: np.ndarray, honest: np.ndarray) -> np.ndarray:
    """g - 0.5 (w - g)."""
    return (global_weights - INNER_PRODUCT_EPS * update(global_weights, honest)).astype(np.float32)


def paper_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max: s = floor(n/2 + 1) - f peers must be won over; z = Phi^-1((n - s) / n).
    (n=10: f=1 gives 0, f=2 0.25, f=3 0.52, f=4 0.84.)"""
    s = n // 2 + 1 - f
    share = min(max((n - s) / n, 1e-6), 1 - 1e-6)
    return float(NormalDist().inv_cdf(share))


def little_is_enough(global_weights: np.ndarray, colluders: Sequence[np.ndarray], z: float) -> np.ndarray:
    """g + mean - z * std, per coordinate, of the colluders' honest updates (w_i - g); std with ddof 0."""
    updates = np.stack([update(global_weights, w) for w in colluders])
    return (global_weights.astype(np.float64) + updates.mean(axis=0) - z * updates.std(axis=0)).astype(np.float32)


def codec_of(job: Job) -> Codec | None:
    """The codec a job's results travel in (None: float32 weights)."""
    return codec_from_json(job.codec) if job.codec else None


def result_weights(message: bytes, global_weights: np.ndarray, codec: Codec | None = None) -> tuple[wire.WireHeader,
                                                                                                 np.ndarray]:
    """A result message of either kind as (header, the weights it stands for): a session with a codec gets
    updates (``runtime.codec``), which the attacker decodes against the weights it was handed, as the relay does."""
    if not wire.is_update(message):
        return wire.decode(message)
    return wire.result_weights(message, global_weights, codec=codec if codec is not None else NoneCodec())


def as_upload(vector: np.ndarray, header: wire.WireHeader, global_weights: np.ndarray, codec: Codec | None = None,
              seed: int = 0) -> bytes:
    """``vector`` as the upload the session takes: float32 weights, or the update from the weights handed out in the
    session's ``codec`` (seeded by the unit's ``seed``, as an honest peer encodes: a poisoned update goes through the
    same quantizer)."""
    if codec is None or not codec.compresses:
        return wire.encode(vector, header)
    step = (np.asarray(vector, dtype=np.float32) - global_weights).astype(np.float32)
    return wire.encode_update(codec.encode(step, seed), header, codec, wire.weights_digest(global_weights))


def poisoned(attack: str, message: bytes, global_weights: np.ndarray, *, rng: np.random.Generator,
             colluders: Sequence[np.ndarray] = (), z: float = 1.0, codec: Codec | None = None, seed: int = 0) -> bytes:
    """The upload that replaces the honest result ``message``: the same header (round, slot, metrics), new
    weights; ``noise_claim`` also claims CLAIMED_EXAMPLES examples. ``codec``, ``seed``: the session's codec (None:
    float32 weights) and the unit's seed."""
    header, honest = result_weights(message, global_weights, codec)
    if attack == "noise_claim":
        header = dataclasses.replace(header, num_examples=CLAIMED_EXAMPLES)
        vector = noise(global_weights, rng)
    elif attack == "flip":
        vector = flip(global_weights, honest)
    elif attack == "free_rider":
        vector = free_rider(global_weights)
    elif attack == "scaled":
        vector = scaled(global_weights, honest, rng)
    elif attack == "little_is_enough":
        vector = little_is_enough(global_weights, list(colluders) or [honest], z)
    elif attack == "inner_product":
        vector = inner_product(global_weights, honest)
    else:
        raise ValueError(f"unknown attack {attack!r}; known: {', '.join(UPLOAD_ATTACKS)}")
    return as_upload(vector, header, global_weights, codec, seed)


# ---------------------------------------------------------------- one session driven over HTTP


@dataclass
class RunSpec:
    url: str
    attack: str | None  # None: the honest run
    attackers: int  # peers (of k) that attack; for sybil, ignored (the admitted sybil joins attack)
    k: int
    seed: int = 0
    z: float | None = 1.0  # little_is_enough's z; None: the paper's formula for n = k and f = attackers
    honest_first: int = 0  # an attacker's first N uploads are its honest results (past a check of first results)
    sybil_joins: int = 10
    timeout_s: float = 600.0
    admin_token: str | None = None  # read the relay's peer listing (bans) after the session
    hold_s: float = 15.0
    request_timeout_s: float = 120.0
    replay_engine: str = "native"  # the relay's (--replay-engine, resolved): where it refuses other engines' results
    # on a task, the peers train on it (``attack_training.peer_engine``)


@dataclass
class Observed:
    """What the peers saw of one session."""

    uploads: Counter[str] = field(default_factory=Counter)  # "honest accepted", "flip refused.update_outlier", ...
    joins: Counter[str] = field(default_factory=Counter)  # "honest admitted", "sybil refused.too_many_peers", ...
    round_seconds: list[float] = field(default_factory=list)  # last upload -> the next round's first assignment
    trained: int = 0
    reused: int = 0
    stalled: bool = False  # the run hit its time or request budget before the session was done
    seconds: dict[str, float] = field(default_factory=dict)  # the peers' time by step: ask, hold, fetch, train...
    session_seconds: float = 0.0  # the first request for work -> the relay's "done" (joins and start-up excluded)
    peers: list[dict[str, Any]] = field(default_factory=list)  # per peer run: role, ban (see ``peer_listing``)

    def spent(self, step: str, since: float) -> float:
        """Add the time since ``since`` to ``step``; returns now."""
        now = time.perf_counter()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - since
        return now

    def accepted(self, role: str) -> int:
        return self.uploads[f"{role} accepted"]

    def attempted(self, role: str) -> int:
        return sum(n for key, n in self.uploads.items() if key.split(" ")[0] == role)


@dataclass
class Attacker:
    """An attacker's hooks: it sees its honest result (and shares it with its colluders) before any of them uploads,
    then uploads ``attack``'s poisoned result instead, after ``honest_first`` honest uploads."""

    attack: str
    colluders: dict[int, list[np.ndarray]]  # round -> the honest weights of every attacker of the run, shared
    trainer: Trainer
    rng: np.random.Generator  # the run's generator (the noise of each upload is drawn in the order of the uploads)
    z: float
    honest_first: int
    uploaded: int = 0
    handed: bytes = b""  # the weights message its last honest result was trained from

    def saw(self, job: Job, weights: bytes, honest: bytes) -> None:
        self.handed = weights
        global_weights = self.trainer.global_weights(weights)
        self.colluders.setdefault(job.round, []).append(result_weights(honest, global_weights, codec_of(job))[1])

    def upload(self, job: Job, honest: bytes) -> bytes:
        self.uploaded += 1
        if self.uploaded <= self.honest_first:
            return honest
        return poisoned(self.attack, honest, self.trainer.global_weights(self.handed), rng=self.rng,
                        colluders=self.colluders[job.round], z=self.z, codec=codec_of(job), seed=job.unit_seed)

    def hooks(self) -> PeerHooks:
        return PeerHooks(upload=self.upload, honest_result=self.saw)


class BenchPeer:
    """A native peer (``server.harness.peer.RelayPeer``, driven step by step) with its own client address; ``role`` is
    "honest", an attack, or "sybil"; ``hooks`` (an attacker's) replace its uploads. It fetches the relay's current
    weights (``GET /api/weights``) when a job names others than those it holds, as the bench's peers always have."""

    def __init__(self, url: str, address: str, role: str, timeout_s: float, *, join_tries: int,
                 hooks: PeerHooks | None = None) -> None:
        self.role, self.address = role, address
        limits = pooled(2)
        self.transport = SyncTransport(httpx.Client(base_url=url, headers={PROXY_HEADER: address}, timeout=timeout_s,
                                                    limits=limits))
        self.protocol = RelayPeer(hooks=hooks, retry=RetryPolicy(retry_5xx=False), weights_from=WeightsFrom.CURRENT,
                                  join_tries=join_tries, retry_after_cap_s=MAX_RETRY_AFTER)
        self.admitted = False
        self.refused_round: int | None = None  # the round it last knew of when first refused as banned (or 401)

    @property
    def peer_id(self) -> str | None:
        return self.protocol.peer_id

    @property
    def active(self) -> bool:
        """Admitted, and not told to stop (a ban)."""
        return self.admitted and self.protocol.stopped is None

    def run[T](self, steps: Steps[T]) -> T:
        return self.transport.run(steps)

    def note(self, refusal: Refused) -> None:
        """A ban or a revoked token (401) is noted with the round the peer knew of (that of the weights it holds)."""
        if (refusal.code == "banned" or refusal.status == 401) and self.refused_round is None:
            self.refused_round = self.protocol.held_round if self.protocol.held_round is not None else 0

    def close(self) -> None:
        self.transport.close()

    def join(self) -> str:
        """"admitted" or "refused.<code>" (a peer that retries waits what a 429's Retry-After says)."""
        joined = self.run(self.protocol.sign_in())
        self.admitted = not isinstance(joined, Refused)
        return f"refused.{joined.code}" if isinstance(joined, Refused) else "admitted"


def drive(spec: RunSpec, trainers: dict[str, Trainer], workers: int = 1) -> tuple[dict[str, Any], Observed]:
    """Join, train and upload until the session is done (or the run's budget is spent); returns the relay's
    final ``/api/session`` status and what the peers observed. ``trainers`` keeps a Trainer per task (made
    here with ``workers`` training processes when the task is new; the caller closes them)."""
    observed = Observed()
    deadline = time.monotonic() + spec.timeout_s
    rng = np.random.default_rng(spec.seed)
    roles = ["honest"] * spec.k
    if spec.attack in UPLOAD_ATTACKS:
        for index in rng.choice(spec.k, size=spec.attackers, replace=False):
            roles[int(index)] = spec.attack
    observer = RelayClient(httpx.Client(base_url=spec.url, timeout=spec.request_timeout_s))
    peers: list[BenchPeer] = []
    sybils: list[BenchPeer] = []
    try:
        info = observer.task()
        engine = peer_engine(info, spec.replay_engine)
        if f"{info['fingerprint']} {engine}" not in trainers:
            trainers[f"{info['fingerprint']} {engine}"] = bench_trainer(info, workers, engine)
        trainer = trainers[f"{info['fingerprint']} {engine}"]
        colluders: dict[int, list[np.ndarray]] = {}  # round -> the attackers' honest weights (little_is_enough)
        z = spec.z if spec.z is not None else paper_z(spec.k, spec.attackers)

        def hooks(role: str) -> PeerHooks | None:
            attack = SYBIL_UPLOAD if role == "sybil" else role if role in UPLOAD_ATTACKS else None
            return Attacker(attack, colluders, trainer, rng, z, spec.honest_first).hooks() if attack else None

        for i, role in enumerate(roles):
            peers.append(BenchPeer(spec.url, f"10.0.{i // 250}.{i % 250 + 1}", role, spec.request_timeout_s,
                                   join_tries=JOIN_RETRIES, hooks=hooks(role)))
            observed.joins[f"{role} {peers[-1].join()}"] += 1
        if spec.attack == "sybil":
            for _ in range(spec.sybil_joins):
                sybils.append(BenchPeer(spec.url, SYBIL_ADDRESS, "sybil", spec.request_timeout_s, join_tries=1,
                                        hooks=hooks("sybil")))
                observed.joins[f"sybil {sybils[-1].join()}"] += 1
        everyone = sybils + peers  # the order peers ask in is shuffled on every pass
        trained, reused = trainer.trained, trainer.reused
        clock = time.perf_counter()
        rounds_of_work(spec, everyone, trainer, observed, rng, deadline)
        observed.session_seconds = time.perf_counter() - clock
        observed.trained, observed.reused = trainer.trained - trained, trainer.reused - reused
        if spec.admin_token:
            response = observer.http.get("/api/admin/peers", headers={"Authorization": f"Bearer {spec.admin_token}"})
            try:
                listing = response.json().get("peers", []) if response.status_code == 200 else []
            except ValueError:  # not JSON: a relay without the listing; the ban columns stay empty
                listing = []
            observed.peers = peer_listing(everyone, listing)
        return observer.status(), observed
    finally:
        for peer in peers + sybils:
            peer.close()
        observer.http.close()


def peer_listing(peers: Sequence[BenchPeer], listing: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per peer that joined: its role, the relay's word on its ban (``GET /api/admin/peers``: ``banned``,
    ``ban_reason``, ``banned_at``; None where the listing lacks the peer) and ``refused_round``."""
    by_id = {str(entry.get("peer_id")): entry for entry in listing}
    out = []
    for peer in peers:
        if peer.peer_id is None:
            continue  # its join was refused
        entry = by_id.get(peer.peer_id, {})
        out.append({"role": peer.role, "peer_id": peer.peer_id,
                    "banned": entry.get("banned") if entry else None, "ban_reason": entry.get("ban_reason"),
                    "banned_at": entry.get("banned_at"), "refused_round": peer.refused_round})
    return out


def ask(peer: BenchPeer, observed: Observed, hold: float | None = None) -> WorkAnswer:
    answer = peer.run(peer.protocol.ask(hold))
    if isinstance(answer, Refused):
        observed.uploads[f"{peer.role} work_refused.{answer.code}"] += 1
        peer.note(answer)
        return Wait(0.0, answer.code)
    return answer


def poll(everyone: list[BenchPeer], batch: dict[int, tuple[BenchPeer, Job]], observed: Observed,
         rng: np.random.Generator) -> bool:
    """Every active peer not yet in ``batch`` asks once, in a shuffled order (who asks first gets a slot first);
    assignments go into ``batch``. True when the relay says the session is done."""
    waiting = [p for p in everyone if p.active and id(p) not in batch]
    for index in rng.permutation(len(waiting)):
        peer = waiting[int(index)]
        job = ask(peer, observed)
        if isinstance(job, Done):
            return True
        if isinstance(job, Job):
            batch[id(peer)] = (peer, job)
    return False


def rounds_of_work(spec: RunSpec, everyone: list[BenchPeer], trainer: Trainer, observed: Observed,
                   rng: np.random.Generator, deadline: float) -> None:
    """Each pass: every active peer asks for work; those given an assignment fetch it, the pass's units train at once
    on ``trainer`` (the attackers see each other's honest results), all upload in a shuffled order (the attackers'
    hooks replace theirs). With no work to hand out, one peer's held request waits for the next round (what a
    browser's worker does), which also times the relay's work between rounds."""
    last_upload, last_round = None, -1
    for _ in range(MAX_PASSES):  # every pass makes requests; the deadline ends a stuck run first
        if time.monotonic() > deadline:
            observed.stalled = True
            return
        batch: dict[int, tuple[BenchPeer, Job]] = {}
        clock = time.perf_counter()
        if poll(everyone, batch, observed, rng):
            return
        clock = observed.spent("ask", clock)
        if not batch:
            holder = next((p for p in everyone if p.active and p.role == "honest"), None)
            if holder is None:
                observed.stalled = True
                return
            job = ask(holder, observed, min(spec.hold_s, max(0.0, deadline - time.monotonic())))
            clock = observed.spent("hold", clock)
            if isinstance(job, Done):
                return
            if not isinstance(job, Job):
                continue
            if last_upload is not None and job.round > last_round:
                observed.round_seconds.append(time.perf_counter() - last_upload)
            batch[id(holder)] = (holder, job)
            if poll(everyone, batch, observed, rng):  # the others take the new round's other slots
                return
            clock = observed.spent("ask", clock)
        fetched: list[tuple[BenchPeer, Job, Fetched]] = []
        for peer, job in batch.values():
            got = peer.run(peer.protocol.fetch(job))
            if isinstance(got, Refused):  # banned meanwhile (a replay of an earlier result), or the lease lost
                observed.uploads[f"{peer.role} fetch_refused.{got.code}"] += 1
                peer.note(got)
                continue
            fetched.append((peer, job, got))
        clock = observed.spent("fetch", clock)
        messages = trainer.train_all([(job, got.weights, got.unit) for _, job, got in fetched])
        clock = observed.spent("train", clock)
        uploads = []
        for (peer, job, got), message in zip(fetched, messages, strict=True):
            if message is None:  # (a job whose round an undo took back while its weights were fetched: dropped)
                observed.uploads[f"{peer.role} stale_job"] += 1
                continue
            uploads.append((peer, job, peer.protocol.trained(job, got, message)))
        for index in rng.permutation(len(uploads)):
            peer, job, result = uploads[int(index)]
            receipt = peer.run(peer.protocol.upload(job, result))
            if isinstance(receipt, Refused):
                observed.uploads[f"{peer.role} refused.{receipt.code}"] += 1
                if receipt.code == "banned":
                    peer.note(receipt)
            else:
                observed.uploads[f"{peer.role} accepted"] += 1
            last_upload, last_round = time.perf_counter(), max(last_round, job.round)
        observed.spent("upload", clock)
    observed.stalled = True
