"""``peertrain bench relay``: what the relay adds to a round, against the peers' training time.

A real ``peertrain serve`` subprocess runs bytetext (bytelm-2.3mb) for k = 5 (55 chunks) and k = 100
(``--set chunks=100``, so that k <= units). Simulated peers over loopback (httpx, asyncio) skip the
training: each asks for work, downloads the global weights and uploads them plus a small fixed
perturbation, all k at once. Per round it measures

* the upload latency (the relay's checks and the SQLite insert included) and the aggregate upload
  throughput (MB/s from the first upload's start to the last one's end);
* the relay's own time: from the last upload's end until every peer holds its next assignment (peers
  ask with ``POST /api/work?hold=S``, as browsers do, so the relay answers the moment the round opens)
  minus the validation time the session records (``history[-1].seconds``), split into merge (recorded)
  and the rest (the results' checks, checkpoint, handing out the next round);
* the weights fan-out: from the peers holding their assignments until all k hold the round's weights;
* the page's samples (generated text), which the relay makes after opening the next round: how long
  after it they appear. The bench waits for them before the next uploads, as real peers would still be
  training; were samples slower than training, the next merge would queue behind them.

Checks per upload are also timed in-process (wire decode with its finiteness check, the update norm).
The anchors, in the same run: one bytetext unit trained natively (``ByteTextTask.train_unit``) and one
trained by the page's worker in headless Chromium (Pyodide, fetched from a relay as a browser peer does).
The relay's share of a k=5 round = relay time / a peer's training time; target < 5 % against the browser
peers the relay serves. The share against native training is the pessimistic figure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx
import numpy as np

from runtime import wire
from runtime.protocol import Done, Job
from server.browser.launcher import RELAY_START_SECONDS
from server.browser_assets import engines
from server.harness.peer import (
    AsyncTransport,
    Refused,
    RelayPeer,
    Result,
    RetryPolicy,
    Trainer,
    WeightsFrom,
    pooled,
    run_async,
)
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.client import AsyncRelayClient, RelayRefusal, status_call
from server.relay.options import RelayOptions
from server.session.config import SessionConfig
from server.session.package import Package, build_package

ADMIN = "bench-relay"
POLL_SECONDS = 0.01
HOLD_SECONDS = 15.0
TARGET_SHARE = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ks", default="5,100", help="participants per round to measure (comma list)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds timed per k")
    parser.add_argument("--perturbation", type=float, default=1e-3, help="std of the fake update")
    parser.add_argument("--work-dir", type=Path, help="packages and sessions (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/relay.json"), help="figures as JSON")
    parser.add_argument("--skip-training", action="store_true", help="do not time the native anchor (one unit)")
    parser.add_argument("--skip-browser", action="store_true", help="do not time the browser anchor (one unit)")
    parser.add_argument("--verify-fraction", type=float, default=None,
                        help="run the relay with host replays of this share of results (every peer's first too); "
                        "the simulated peers then train their units natively for real, before the clock (use with "
                        "--ks 5); default: no verification, made-up results")
    parser.add_argument("--replay-workers", type=int, default=None,
                        help="the relay's replay pool with --verify-fraction (its --replay-workers; default the "
                        "relay's: half the cores, 2 to 8)")


@dataclass
class RoundFigures:
    round: int
    upload_seconds: list[float]  # each upload's latency
    upload_mb_per_s: float  # all bytes of the round / (last end - first start)
    relay_seconds: float  # last upload's end -> every peer holds its next assignment
    merge: float
    validate: float
    fan_out: float  # every peer holds its assignment -> every peer holds the round's weights
    samples: float  # round available -> the page's samples for it (off the critical path)
    replayed: int = 0  # results of the round the host replayed (--verify-fraction)
    replay_wait: float = 0.0  # how long the merge waited for them (part of relay_seconds)


@dataclass
class KFigures:
    k: int
    units: int
    message_mb: float
    check_seconds: float  # in-process decode + finiteness + norm of one result
    rounds: list[RoundFigures] = field(default_factory=list)
    peak_rss_mb: float = 0.0  # the relay process's peak resident memory over its session

    def mean(self, name: str) -> float:
        return float(statistics.fmean(getattr(r, name) for r in self.rounds))

    @property
    def added(self) -> float:
        """The relay's time per round less validation (which any host must spend)."""
        return self.mean("relay_seconds") - self.mean("validate")

    @property
    def upload_median(self) -> float:
        return float(statistics.median(s for r in self.rounds for s in r.upload_seconds))


# A request that got no answer (a pooled connection the relay closed as the client reused it: at k = 300 on a loaded
# machine, 2 of 4 runs died on it) is sent again, as a browser's network stack does; a relay that is gone still
# fails the run after these tries.
RESEND = RetryPolicy(resend=3, retry_5xx=False)


# ---------------------------------------------------------------- the relay under test


def serve_command(package: Path, session_dir: Path, k: int, passes: int,
                  verify_fraction: float | None = None, replay_workers: int | None = None) -> ServeCommand:
    # Made-up results would fail a host replay: verification runs only where the peers train for real, on the
    # engine the relay replays on (the browser's, Pyodide under Node, where it runs; else native, forced for bytetext)
    native = engines.pyodide_missing() is not None
    verify: dict[str, Any] = {"verify": False} if verify_fraction is None else {
        "verify_fraction": verify_fraction, "replay_engine": "native" if native else "pyodide",
        "replay_workers": replay_workers or None}
    # backup_after None: each simulated peer trains one unit a round and asks for the next at once; a backup of a
    # unit of the round being merged would be stale by the time it is fetched
    options = RelayOptions(admin_token=ADMIN, lease_seconds=3600.0, peer_timeout=3600.0, backup_after=None,
                           # every simulated peer joins from loopback at once: no admission limit per address here
                           join_rate=0.0, max_peers_per_address=0, **verify)
    # codec none: the simulated peers upload float32 weights (this bench times the relay, not codecs)
    config = SessionConfig(participants=k, passes=passes, codec="none")
    return ServeCommand(package=package, session_dir=session_dir, fresh=True, config=config, options=options,
                        force_verify=native and verify_fraction is not None)


# ---------------------------------------------------------------- simulated peers


@dataclass
class SimPeer:
    """One peer of the bench (``server.harness.peer.RelayPeer``, stepped on the bench's shared connection pool), which
    fetches the relay's current weights each round and uploads them plus its fixed perturbation."""

    protocol: RelayPeer
    perturbation: np.ndarray
    weights: np.ndarray | None = None


def fail(refusal: Refused) -> NoReturn:
    """The bench's peers are never refused: a refusal fails the run."""
    raise RelayRefusal(refusal.status, refusal.code, refusal.message)


def steps_of[T](answer: T | Refused) -> T:
    """A step's outcome, which no refusal may take the place of."""
    if isinstance(answer, Refused):
        fail(answer)
    return answer


async def ask_for_work(transport: AsyncTransport, peer: SimPeer) -> tuple[Job, float]:
    """The next assignment and when it arrived; the request is held until a round has work for this peer."""
    while True:
        answer = await transport.run(peer.protocol.ask(HOLD_SECONDS))
        if isinstance(answer, Refused):
            fail(answer)
        if isinstance(answer, Job):
            return answer, time.perf_counter()
        if isinstance(answer, Done):
            raise RuntimeError(f"the session ended early: {answer}")
        await transport.run(peer.protocol.wait(answer))


async def fetch_weights(transport: AsyncTransport, peer: SimPeer, job: Job) -> float:
    header, peer.weights = wire.decode(steps_of(await transport.run(peer.protocol.weights(job))))
    assert header.round == job.round, (header.round, job.round)
    return time.perf_counter()


def fake_result(peer: SimPeer, header: wire.WireHeader) -> bytes:
    """The global weights plus this peer's fixed perturbation, as a result message."""
    assert peer.weights is not None
    return wire.encode(peer.weights + peer.perturbation, header)


async def upload(transport: AsyncTransport, peer: SimPeer, job: Job, body: bytes) -> tuple[float, float, int]:
    started = time.perf_counter()
    steps_of(await transport.run(peer.protocol.upload(job, Result(body, honest=False))))
    return started, time.perf_counter(), len(body)


async def upload_and_ask(transport: AsyncTransport, peer: SimPeer, job: Job, body: bytes,
                         ) -> tuple[tuple[float, float, int], tuple[Job, float]]:
    uploaded = await upload(transport, peer, job, body)
    return uploaded, await ask_for_work(transport, peer)


async def wait_for_round(relay: AsyncRelayClient, round_index: int, *, samples: bool = False) -> dict[str, Any]:
    """Until ``round_index`` rounds are merged (and, with ``samples``, the page's samples made from them)."""
    while True:
        status = await relay.call(status_call())
        if status["round"] >= round_index and not status["merging"] and (
                not samples or (status.get("samples_round") or 0) >= round_index):
            return dict(status)
        await asyncio.sleep(POLL_SECONDS)


async def trained_results(transport: AsyncTransport, peers: list[SimPeer], jobs: list[Job], training: Training,
                          handed_out: float) -> list[bytes]:
    """Each job trained for real, on the relay's replay engine (``--verify-fraction``: a host replay must find the
    same weights), one after another; or, where ``training`` keeps every result of the round from the first session,
    those results when ``training.unit_seconds`` after the hand-out have passed: k peers training in parallel."""
    trainer = training.trainer
    kept = [trainer.kept(job, peer.protocol.weights_message) for peer, job in zip(peers, jobs, strict=True)]
    if training.unit_seconds is not None and all(body is not None for body in kept):
        await asyncio.sleep(max(0.0, handed_out + training.unit_seconds - time.perf_counter()))
        training.timed_rounds += 1
        return [body for body in kept if body is not None]
    out = []
    for peer, job in zip(peers, jobs, strict=True):
        fetched = steps_of(await transport.run(peer.protocol.fetch(job)))
        out.append(trainer.train(job, fetched.weights, fetched.unit))
    return out


@dataclass
class Training:
    """The simulated peers' training where results are replayed: the browser's engine (Pyodide under Node) where it
    runs, as the relay's replays, else native. The first session trains every unit one after another (the replays
    then have k units' time to catch up) and keeps the results; the session is deterministic (the same package,
    seed and results give the same rounds), so a second one uploads them ``unit_seconds`` (a browser unit's time)
    after each hand-out, as k browsers training at once would, while this machine's cores are the relay's alone."""

    trainer: Trainer
    unit_seconds: float | None = None  # None: train (the first session)
    timed_rounds: int = 0  # rounds of the second session uploaded on the browser's clock

    @classmethod
    def for_package(cls, package: Package) -> Training:
        engine = "native" if engines.pyodide_missing() else "pyodide"
        return cls(Trainer(package.task_description(), engine=engine))


async def drive(url: str, package: Package, k: int, rounds: int, perturbation: float,
                figures: KFigures, training: Training | None = None) -> None:
    limits = pooled(k + 4)  # (idle connections dropped before the relay's keep-alive timeout closes them)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        rng = np.random.default_rng(0)
        transport = AsyncTransport(client)
        observer = AsyncRelayClient(client)
        peers = []
        for _ in range(k):
            peer = SimPeer(RelayPeer(weights_from=WeightsFrom.CURRENT, wait_cap_s=math.inf, retry=RESEND),
                           (rng.standard_normal(package.spec.size) * perturbation).astype(np.float32))
            steps_of(await transport.run(peer.protocol.sign_in()))
            peers.append(peer)
        asked = await asyncio.gather(*(ask_for_work(transport, peer) for peer in peers))
        available = max(at for _, at in asked)
        for round_index in range(rounds):
            jobs = [job for job, _ in asked]
            assert all(job.round == round_index for job in jobs), [job.round for job in jobs]
            fetched = await asyncio.gather(*(fetch_weights(transport, peer, job)
                                             for peer, job in zip(peers, jobs, strict=True)))
            fan_out = max(fetched) - available
            header = wire.WireHeader(spec=package.spec, round=round_index, fingerprint=package.fingerprint,
                                     num_examples=1000, metrics={"train_loss": 1.0})
            # Before the clock: the peers' own work.
            bodies = await trained_results(transport, peers, jobs, training, available) if training is not None \
                else [fake_result(peer, header) for peer in peers]
            # Each peer asks for its next unit as soon as its upload is answered, as the page's worker does.
            done = await asyncio.gather(*(upload_and_ask(transport, peer, job, body)
                                          for peer, job, body in zip(peers, jobs, bodies, strict=True)))
            uploads, asked = [pair[0] for pair in done], [pair[1] for pair in done]
            last_end = max(end for _, end, _ in uploads)
            available = max(at for _, at in asked)
            status = await wait_for_round(observer, round_index + 1)
            # Real peers train for seconds now; these would queue the next merge behind the samples.
            await wait_for_round(observer, round_index + 1, samples=True)
            sampled = time.perf_counter()
            seconds = status["history"][-1]["seconds"]
            first_start = min(start for start, _, _ in uploads)
            figures.rounds.append(RoundFigures(
                round=round_index, upload_seconds=[end - start for start, end, _ in uploads],
                replayed=int((status["history"][-1].get("verification") or {}).get("results", 0)),
                replay_wait=float((status["history"][-1].get("verification") or {}).get("waited_seconds", 0.0)),
                upload_mb_per_s=sum(size for _, _, size in uploads) / 1e6 / (last_end - first_start),
                relay_seconds=available - last_end, merge=float(seconds["merge"]),
                validate=float(seconds["validate"]), fan_out=fan_out, samples=sampled - available))
            print(f"  k={k} round {round_index}: relay {available - last_end:.2f} s (merge {seconds['merge']:.3f}, "
                  f"validate {seconds['validate']:.2f}), fan-out {fan_out:.2f} s, samples after "
                  f"{sampled - available:.2f} s" + (f", {figures.rounds[-1].replayed} replayed, the merge waited "
                  f"{figures.rounds[-1].replay_wait:.2f} s for them" if training is not None else ""), flush=True)
            available = sampled  # the fan-out of the next round starts when the bench lets it


def one_session(package: Package, k: int, passes: int, args: argparse.Namespace, work: Path, figures: KFigures,
                training: Training | None) -> None:
    session = work / f"session-k{k}"
    shutil.rmtree(session, ignore_errors=True)
    with RelayProcess(serve_command(package.path, session, k, passes, args.verify_fraction, args.replay_workers),
                      log=work / f"serve-k{k}.log", start_timeout_s=RELAY_START_SECONDS) as relay:
        url = relay.page_url
        print(f"k={k}: relay at {url}, {package.data.num_units} units, {passes} passes", flush=True)
        run_async(lambda: drive(url.rstrip("/"), package, k, args.rounds, args.perturbation, figures, training))
        figures.peak_rss_mb = relay.peak_rss_mb()
        print(f"  k={k}: the relay's peak RSS {figures.peak_rss_mb:.0f} MB", flush=True)
    shutil.rmtree(session, ignore_errors=True)  # k x 2.3 MB of results per round


# ---------------------------------------------------------------- in-process figures


def check_seconds(package: Package, repeats: int = 5) -> float:
    """What the relay does with each upload before storing it, in-process (median)."""
    weights = package.initial_weights
    header = wire.WireHeader(spec=package.spec, round=0, fingerprint=package.fingerprint, num_examples=1000)
    body = wire.encode(weights + np.float32(1e-3), header)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        _, vector = wire.decode(body, expect_spec=package.spec, expect_round=0, expect_fingerprint=package.fingerprint)
        float(np.linalg.norm(vector.astype(np.float64) - weights))
        times.append(time.perf_counter() - started)
    return float(statistics.median(times))


def training_seconds(package: Package) -> float:
    """One bytetext unit trained natively, as a peer would (the anchor)."""
    task, data = package.task, package.data
    unit = task.work_unit(data, 0, 1)
    started = time.perf_counter()
    task.train_unit(package.initial_weights, unit)
    return time.perf_counter() - started


# One unit as the page's worker trains it (through runtime.worker, the module the worker calls): join, ask for
# work, fetch the weights and the chunk, train. (worker_page opens the page with ?test=1, so this code runs.)
BROWSER_UNIT = """
import json, time
from pyodide.http import pyfetch
from runtime.protocol import Job
from runtime.worker import build_peer

async def get(path, **options):
    response = await pyfetch(path, **options)
    if not response.ok:
        raise RuntimeError(f"{path}: HTTP {response.status}")
    return response

joined = await (await get("/api/join", method="POST", body="{}")).json()
auth = {"Authorization": f"Bearer {joined['peer_id']}:{joined['token']}"}
peer = build_peer(json.dumps(await (await get("/api/task")).json()))
job = Job.from_json(await (await get("/api/work", method="POST", headers=auth)).json())
peer.set_weights(await (await get("/api/weights", headers=auth)).bytes())
chunk = await (await get(f"/api/unit/{job.unit_index}", headers=auth)).bytes()
started = time.perf_counter()
peer.train(job.dumps(), chunk)
json.dumps({"seconds": time.perf_counter() - started, "unit": job.unit_index})
"""


def browser_training_seconds(package: Package, work: Path) -> float:
    """One bytetext unit trained in the page's worker (Pyodide in headless Chromium, its default matmul)."""
    from server.browser.launcher import relay_process, run_in_worker, worker_page

    serve = serve_command(package.path, work / "session-browser", 1, 1)
    with relay_process(serve, log_path=work / "serve-browser.log") as url, worker_page(url) as page:
        return float(json.loads(run_in_worker(page, BROWSER_UNIT))["seconds"])


# ---------------------------------------------------------------- the run


def table(results: list[KFigures], train: float | None, browser: float | None) -> str:
    lines = ["| k | units | rounds | upload MB | upload latency median (ms) | checks in-process (ms) | "
             "upload MB/s | merge (s) | validate (s) | relay per round (s) | relay less validation (s) | "
             "weights fan-out (s) | samples, off the critical path (s) | share vs browser unit | "
             "share vs native unit | relay peak RSS (MB) |", "|" + " ---: |" * 16]
    for f in results:
        shares = " | ".join(f"{f.added / anchor:.1%}" if anchor else "-" for anchor in (browser, train))
        lines.append(f"| {f.k} | {f.units} | {len(f.rounds)} | {f.message_mb:.2f} | {1e3 * f.upload_median:.0f} | "
                     f"{1e3 * f.check_seconds:.1f} | {f.mean('upload_mb_per_s'):.0f} | {f.mean('merge'):.3f} | "
                     f"{f.mean('validate'):.2f} | {f.mean('relay_seconds'):.2f} | {f.added:.3f} | "
                     f"{f.mean('fan_out'):.2f} | {f.mean('samples'):.2f} | {shares} | {f.peak_rss_mb:.0f} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    ks = [int(k) for k in str(args.ks).split(",") if k.strip()]
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="peertrain-bench-relay-"))
    work.mkdir(parents=True, exist_ok=True)
    packages: dict[int, Package] = {}
    results: list[KFigures] = []
    train: float | None = None
    browser: float | None = None
    try:
        for k in ks:
            chunks = max(55, k)
            if chunks not in packages:
                packages[chunks] = build_package("bytetext", {"chunks": chunks}, work / f"package-{chunks}",
                                                 check=False, log=lambda _: None)
            package = packages[chunks]
            if train is None and not args.skip_training:
                train = training_seconds(package)
                print(f"anchor: one bytetext unit trains natively in {train:.2f} s", flush=True)
            if browser is None and not args.skip_browser:
                browser = browser_training_seconds(package, work)
                print(f"anchor: one bytetext unit trains in a browser peer in {browser:.2f} s", flush=True)
            passes = -(-(args.rounds + 1) * k // chunks)  # enough planned rounds that none ends the session
            figures = KFigures(k=k, units=chunks, message_mb=len(wire.encode(package.initial_weights, wire.WireHeader(
                spec=package.spec, round=0, fingerprint=package.fingerprint, num_examples=1000))) / 1e6,
                check_seconds=check_seconds(package))
            training = Training.for_package(package) if args.verify_fraction is not None else None
            if training is not None:  # the first session trains the results; the second is timed with them
                trained = dataclasses.replace(figures, rounds=[])
                print(f"k={k}: a first session trains every unit, one after another", flush=True)
                one_session(package, k, passes, args, work, trained, training)
                training.trainer.close()
                training.unit_seconds = browser or train
                print(f"k={k}: the same session again, each round's results uploaded "
                      f"{training.unit_seconds or 0:.2f} s (a browser unit) after the hand-out", flush=True)
            one_session(package, k, passes, args, work, figures, training)
            if training is not None and training.timed_rounds < len(figures.rounds):
                print(f"WARNING: {len(figures.rounds) - training.timed_rounds} rounds of the timed session were "
                      "trained again (the session did not repeat the first): their replays had k units' time")
            results.append(figures)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    print()
    print(table(results, train, browser))
    at_5 = next((f for f in results if f.k == 5), None)
    for label, anchor in (("a browser peer's", browser), ("native", train)):
        if at_5 is not None and anchor:
            share = at_5.added / anchor
            verdict = "meets" if share < TARGET_SHARE else "misses"
            print(f"relay share of a k=5 round against {label} training: {at_5.added:.3f} s of relay time "
                  f"(validation excluded) per {anchor:.2f} s = {share:.1%}; {verdict} the target of "
                  f"< {TARGET_SHARE:.0%}")
    if args.verify_fraction is not None and at_5 is not None and browser:
        later = at_5.rounds[1:] or at_5.rounds  # (every peer's first result is replayed: its backlog comes first)
        wait = statistics.fmean(r.replay_wait for r in later)
        typical = statistics.median(r.replay_wait for r in later)
        print(f"host replays at --verify-fraction {args.verify_fraction:g}, k=5: the merge waited "
              f"{', '.join(f'{r.replay_wait:.2f}' for r in at_5.rounds)} s in rounds 1-{len(at_5.rounds)}; after round "
              f"1, median {typical:.3f} s = {typical / browser:.1%} and mean {wait:.3f} s = {wait / browser:.1%} of a "
              f"browser unit ({browser:.2f} s); goal < 10%")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"train_seconds": train, "browser_train_seconds": browser,
                                    "results": [asdict(f) for f in results]}, indent=1))
    print(f"figures: {args.out}")
    return 0
