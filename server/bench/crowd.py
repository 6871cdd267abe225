"""``peertrain bench crowd``: one real relay and a crowd of simulated peers that do not train.

A crowd is what volunteer training exists for, and what the relay's cost per round must not grow with. A real
``peertrain serve`` subprocess runs bytetext (bytelm-2.3mb, 584,736 weights) with int8 results (``--codec``), one
chunk per unit and at least as many units as a round takes; joins are unlimited per address and replays are off
(the results are made up, and a host replay of a made-up result fails).

``--peers`` simulated peers (the harness peer, ``server.harness.peer.RelayPeer``, on ``httpx.AsyncClient``; one
client per loopback address 127.0.0.2, 127.0.0.3, ... up to ``--addresses`` of them, so the crowd comes from many
homes) join, hold-poll ``POST /api/work?hold=S`` and upload for each job its unit's precomputed honest update:
one of 8 fixed random updates of standard deviation ``--perturbation`` (the unit's index picks which), encoded in
the session's codec once, so any peer given a unit uploads the same bytes (a second copy agrees, bit for bit: the
results name one engine). They do not fetch the weights (the job names their digest, which the update carries).
After each upload a peer asks for work once without hold (answered at once: the relay's latency), then holds.

Liars (``--liars``, a tenth of the crowd by default, spread through it): every result they upload is a lie that
passes every check of its size, as the free-riders and flippers of ``bench attacks`` that are not refused at the
door: half upload another unit's update (a free-rider's plausible result), half the honest update negated (a
flip of the same norm), each liar's lie its own (scaled by 1 + n / 1000 for the n-th liar: two liars do not send the
same bytes). ``--colluding``: every liar of a kind sends the same lie for a unit, as one cheating client run by many
people would; then two liars given one unit agree, and a quorum of them can outvote an honest peer (the figure
measures how often: no rule that compares results can tell two agreeing liars from two agreeing honest peers). No
host replay can judge a made-up result, so every setting checks by copies (``--redundancy``, the relay's: that share
of units, and every result of a peer no copy has confirmed yet, trained by a second peer and compared bit for bit;
results that differ go to more peers until two agree, which settles it by quorum and bans the others; in async mode
a copied result waits out of the merges for its copy, from the version it started from). A banned liar stops.

Settings, each on a fresh relay: synchronous rounds at each k of ``--ks`` (``--rounds`` rounds timed after the
first), the crowd's size max(k, --peers) except for the anchor k = 5 (5 honest peers, no copies); and, unless
``--async-k 0``, buffered asynchronous merging of every ``--async-k`` results with ``--peers`` peers for
``--async-seconds`` (or until ``--async-merges`` merges are in, if sooner; a liar whose copy or quorum is not in
by then is not banned yet). ``--relays N`` serves the async setting with N relay
processes over one ``--store postgresql://...`` (the first holds the session and merges, the others serve beside it:
``server.relay.sharing``); the crowd's loopback addresses go to them in turn, as a proxy keeping each client on one
relay would, and the figures add up their CPU (their peak RSS: the largest).

Per setting: the relay's time after a round's last result (its upload answered) until k peers hold the next
round's assignments, less the validation the history records, and its share of a browser unit (the anchor: one
bytetext unit trained by the page's worker in headless Chromium, in the same run; ``--skip-browser``: a native
unit, ``--skip-training`` too: no share); the relay's peak RSS (VmHWM) against k = 5's; results per second
taken (async: from the first result to the last; sync: results over the timed rounds' wall time) and, async, per
second merged by the time the crowd stopped, with the results still waiting in the buffer then (a relay that takes
results faster than it merges them keeps up with neither for long: the merged rate is the sustained one); p50/p99 of
work requests answered at once and of result requests; units lost (a unit handed out in a merged round that is
in no merged round's units nor carried by one, a ban's undo included; async: an honest peer's accepted result that
the store holds neither merged, waiting nor in an open dispute once the relay stopped; must be 0); liars
banned of those with a result accepted, honest peers banned (must be 0), liars' results taken as a slot's result
(async: accepted into the buffer, where a copied one merges only once its copy agrees),
second copies as a share of the crowd's accepted results (volunteer compute spent on checking), and the relay
process's CPU seconds per 100 accepted results (everything it does while the crowd runs, its own start left out:
with copies instead of host replays, checking costs the host only a comparison), beside it the bench process's own
CPU per 100 results once its clients are made (the thousand simulated clients share the two cores with the relay,
and what they take is not the relay's to use); refusals by code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from runtime.protocol import Job
from server.bench import upload_floor
from server.bench.crowd_clients import HOLD_SECONDS, CrowdSlice, Slice, Updates, lie_plan, merge_slice, slices
from server.bench.crowd_figures import (
    ANCHOR_K,
    Figures,
    Lie,
    Timeline,
    async_units_lost,
    copy_share,
    count_liars,
    cpu_per_100,
    liars,
    lost,
    merged,
    relay_own_seconds,
    summarize,
    table,
)
from server.bench.relay import browser_training_seconds, training_seconds
from server.browser.launcher import RELAY_START_SECONDS
from server.harness.peer import run_async
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.paths import REPO_ROOT
from server.relay.client import AsyncRelayClient, RelayRefusal, status_call
from server.relay.options import DEFAULT_LIMIT_CONCURRENCY, RelayOptions, ServerLimits
from server.relay.store.location import is_server
from server.session.config import SessionConfig
from server.session.package import Package, build_package

ADMIN = "crowd-bench-admin"
STATUS_SECONDS = 60.0  # the bench asks a busy relay for its status again for this long before the setting stops
RELAY_SHARE_GOALS = {100: 0.05, 1000: 0.10}  # the relay's time after the last result, as a share of a browser unit
ASYNC_GOAL = 200  # results per second, asynchronous, with 1,000 peers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=1000, help="simulated peers (sync: at least k)")
    parser.add_argument("--ks", default="100,1000", help="participants per synchronous round (comma list; the k = 5 "
                        "anchor runs first)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds timed per k, after the first")
    parser.add_argument("--async-k", type=int, default=100, help="results per merge in the asynchronous setting "
                        "(0: skip it)")
    parser.add_argument("--async-seconds", type=float, default=30.0, help="how long the asynchronous crowd runs "
                        "(at most, with --async-merges)")
    parser.add_argument("--async-validate-every", type=int, default=1, metavar="N", help="the asynchronous relay's "
                        "--validate-every (default 1, serve's: a validation after every merge, which costs a merge "
                        "as much as about 30 results' parts here)")
    parser.add_argument("--async-merges", type=int, default=0, help="stop the asynchronous crowd once this many "
                        "merges are in (0: run for --async-seconds)")
    parser.add_argument("--floor-seconds", type=float, default=10.0, help="before the asynchronous setting, how long "
                        "to measure this machine's floor, its anchor: a bare app that only receives, hashes and stores "
                        "each upload of a result's size in SQLite, under 50 of the crowd's clients "
                        "(server.bench.upload_floor; 0: skip it)")
    parser.add_argument("--codec", default="int8", help="the session's result codec (none, int8, topk)")
    parser.add_argument("--liars", type=float, default=0.1, help="share of the crowd that lies on every result, "
                        "half as free-riders (another unit's update), half flipping the honest one (same norm)")
    parser.add_argument("--colluding", action="store_true", help="every liar of a kind sends the same lie for a "
                        "unit (one cheating client run by many people): a quorum of liars can outvote an honest peer, "
                        "and the bench then measures how often instead of failing on it")
    parser.add_argument("--redundancy", type=float, default=0.2, help="the relay's --redundancy: share of units a "
                        "second peer trains, compared bit for bit; a dispute is settled by a third peer's result")
    parser.add_argument("--verify-trust", type=int, default=0, metavar="W", help="the relay's --verify-trust: "
                        "adaptive replication of the copies (each copy a peer passes doubles its window of copies, "
                        "--verify-every 4, 8, ... W, and halves its --redundancy share; 0: the seeded share)")
    parser.add_argument("--unit-seconds", type=float, default=0.0, help="seconds each peer waits before uploading a "
                        "unit, as if it trained it (0: at once; a browser unit of bytetext is about 2.7 s here): the "
                        "next round's first results then do not compete with its hand-out, as a real crowd's do not")
    parser.add_argument("--perturbation", type=float, default=1e-3, help="std of the precomputed updates")
    parser.add_argument("--addresses", type=int, default=250, help="loopback addresses the crowd comes from "
                        "(127.0.0.2 on)")
    parser.add_argument("--client-processes", type=int, default=1, metavar="P", help="spread the crowd over P "
                        "processes of HTTP clients (the bench's own and P - 1 more, each with its share of the peers "
                        "and of --addresses): one process cannot drive ten thousand peers on its own event loop")
    parser.add_argument("--work-dir", type=Path, help="packages and sessions (default: a temporary folder)")
    parser.add_argument("--store", metavar="URL", help="the relay's --store for every setting (postgresql://...: "
                        "each setting drops its tables first, as serve --fresh); default: SQLite in the session")
    parser.add_argument("--relays", type=int, default=1, help="relay processes serving each setting but the k = 5 "
                        "anchor together (a replica each past the first; needs --store postgresql://...): the "
                        "crowd's clients are spread over them, one relay per loopback address")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/crowd.json"), help="figures as JSON")
    parser.add_argument("--skip-training", action="store_true", help="do not time the native anchor (one unit)")
    parser.add_argument("--skip-browser", action="store_true", help="do not time the browser anchor (one unit)")


def serve_command(package: Path, session_dir: Path, k: int, passes: int, codec: str, mode: str,
                  peers: int, redundancy: float = 0.0, verify_trust: int = 0, store: str | None = None,
                  validate_every: int = 1, fresh: bool = True) -> ServeCommand:
    # --limit-concurrency: each peer holds a connection (a browser page about two: its event stream too); the
    # default (1,000) answers 503 past that, so a crowd's host raises it, as here
    options = RelayOptions(admin_token=ADMIN, lease_seconds=3600.0, peer_timeout=3600.0, backup_after=None,
                           join_rate=0.0, max_peers_per_address=0, verify=False,
                           redundancy=redundancy,
                           verify_trust=verify_trust)
    limits = ServerLimits(limit_concurrency=max(DEFAULT_LIMIT_CONCURRENCY, 3 * peers + 100))
    config = SessionConfig(participants=k, passes=passes, codec=codec, mode=mode, validate_every=validate_every)
    return ServeCommand(package=package, session_dir=session_dir, store=store, fresh=fresh, config=config,
                        options=options, limits=limits)


async def until(relay: AsyncRelayClient, done: Any, timeout: float) -> dict[str, Any]:
    """Poll the relay's status until ``done(status)``; a bounded wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = dict(await relay.call(status_call()))
        except (RelayRefusal, httpx.TransportError) as error:  # (503: the crowd holds the relay's
            #   --limit-concurrency; a dropped connection: a relay too busy to answer within its keep-alive. Again.)
            if isinstance(error, RelayRefusal) and error.status != 503 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
            continue
        if done(status) or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.05)


async def drive(urls: list[str], package: Package, peers: int, figures: Figures, args: argparse.Namespace,
                rounds: int | None, seconds: float | None, work: Path) -> set[int]:
    """Run the crowd until ``rounds`` rounds are merged (sync) or for ``seconds`` (async); the slots an honest peer's
    result was accepted for (``count_liars``: async units lost are looked for among them once the relay stops). The
    clients of the loopback addresses go to ``urls`` in turn (the first relay holds the session and is watched); with
    ``--client-processes P`` the crowd's slices past the first run in processes of their own (``crowd_clients``)."""
    updates = Updates(package, args.perturbation)
    lies = lie_plan(peers, args.liars if figures.k != ANCHOR_K else 0.0,  # (the anchor: honest)
                    colluding=args.colluding)
    parts = slices(peers, max(1, min(args.addresses, peers, 253)), lies, max(1, min(args.client_processes, peers)))
    timeline, stop = Timeline(), asyncio.Event()
    started = time.process_time()  # (the crowd's own CPU from here: its clients made)
    children = [start_slice(urls, package, part, args, work / f"slice-{n}") for n, part in enumerate(parts[1:], 1)]
    crowd = CrowdSlice(urls, updates, parts[0], timeline, stop, unit_seconds=args.unit_seconds)
    status: dict[str, Any] = {}
    honest: set[int] = set()
    try:
        observer = AsyncRelayClient(crowd.clients[0])
        if rounds is not None:
            last = 0
            while True:  # (a progress line a round; bounded: each round must merge within 10 minutes)
                status = await until(observer, lambda s, n=last: s["round"] > n and not s["merging"] or s["done"], 600)
                if status["round"] <= last:
                    timeline.errors.append(f"round {last} did not merge within 600 s")
                    break
                last = status["round"]
                print(f"  {figures.setting}: {last} of {rounds + 2} rounds merged, {len(timeline.results)} results"
                      + (" (the bench's slice)" if children else ""), flush=True)
                if last >= rounds + 2 or status["done"]:  # (round r is timed once round r + 1 is handed out)
                    break
        else:
            assert seconds is not None  # (for that long, or until --async-merges merges are in, the first)
            deadline, shown = time.monotonic() + seconds, time.monotonic()
            while time.monotonic() < deadline:
                await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                at = await until(observer, lambda _: True, STATUS_SECONDS)
                if time.monotonic() - shown >= 10 or 0 < args.async_merges <= at["round"]:
                    print(f"  {figures.setting}: {at['counters'].get('results_accepted', 0)} results, {at['round']} "
                          "merges", flush=True)
                    shown = time.monotonic()
                if 0 < args.async_merges <= at["round"]:
                    break
            at_stop = await until(observer, lambda _: True, STATUS_SECONDS)  # (what it had merged of what it took)
            first_sent = min((sent for _, _, sent, _ in timeline.results), default=time.perf_counter())
            figures.merged_per_second = at_stop["round"] * figures.k / max(time.perf_counter() - first_sent, 1e-9)
            figures.backlog = int(at_stop["round_progress"]["done"])
        for child in children:  # (each stops its peers and writes what they saw)
            child.process.send_signal(signal.SIGTERM)
        await crowd.finish()
        by_peer = crowd.lies_by_peer()
        crowd_cpu = time.process_time() - started
        for child in children:
            crowd_cpu += await asyncio.to_thread(child.report, timeline, by_peer)
        figures.crowd_cpu_seconds = crowd_cpu
        status = await until(observer, lambda s: rounds is None or not s["merging"], 120)  # (async: a backlog of
        #                                                          results may take many merges more: not waited for)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        listing = (await crowd.clients[0].get("/api/admin/peers", headers=admin)).json()
        audit = await crowd.clients[0].get("/api/admin/export/results", headers=admin, timeout=120)
        honest = count_liars(figures, by_peer, listing["peers"], timeline, status, [
            json.loads(line) for line in audit.text.splitlines() if line] if audit.status_code == 200 else None)
    finally:
        for child in children:
            child.stop()
        await crowd.close()
    summarize(figures, timeline, status, rounds)
    return honest


@dataclass
class Child:
    """A slice of the crowd in a process of its own (``server.bench.crowd_clients``)."""

    process: subprocess.Popen[bytes]
    out: Path

    def report(self, timeline: Timeline, lies: dict[str | None, Lie | None]) -> float:
        """Wait for the slice to end (it was sent SIGTERM) and merge what it saw; its CPU seconds."""
        try:
            self.process.wait(timeout=HOLD_SECONDS + 90)
        except subprocess.TimeoutExpired:
            timeline.errors.append(f"a slice of the crowd did not stop (its log: {self.out.with_suffix('.log')})")
            return 0.0
        if self.process.returncode != 0 or not self.out.exists():
            timeline.errors.append(f"a slice of the crowd failed ({self.process.returncode}; its log: "
                                   f"{self.out.with_suffix('.log')})")
            return 0.0
        return merge_slice(timeline, lies, json.loads(self.out.read_text()))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def start_slice(urls: list[str], package: Package, part: Slice, args: argparse.Namespace, base: Path) -> Child:
    base.parent.mkdir(parents=True, exist_ok=True)
    spec, out = base.with_suffix(".slice.json"), base.with_suffix(".json")
    spec.write_text(json.dumps(part.to_json()))
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "server.bench.crowd_clients", "--urls", ",".join(urls), "--package",
               str(package.path), "--slice", str(spec), "--perturbation", str(args.perturbation), "--unit-seconds",
               str(args.unit_seconds), "--out", str(out)]
    with base.with_suffix(".log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    return Child(process, out)


def measured(setting: Any, package: Package, work: Path, args: argparse.Namespace, figures: Figures,
             **how: Any) -> None:
    """One setting; one that stopped (a relay that dropped the bench's connections, say) is reported with the
    figures it has and the reason, and the next setting runs."""
    try:
        setting(package, work, args, figures, **how)
    except (httpx.HTTPError, RelayRefusal, OSError, TimeoutError) as error:
        figures.errors.append(f"the setting stopped: {type(error).__name__}: {error}")
        print(f"{figures.setting}: stopped: {type(error).__name__}: {error}", flush=True)


def result_bytes(package: Package, codec: str) -> int:
    """The size of a crowd peer's result in ``codec`` (the floor's uploads)."""
    config = SessionConfig(codec=codec)
    job = Job(round=0, slot=0, pass_index=0, unit_index=0, unit_seed=0, kind="data", episodes=0, progress=0.0,
              lease_deadline=0.0, lease_seconds=0.0, weights_round=0, num_rounds=1, fingerprint=package.fingerprint,
              weights_digest="0" * 64, codec=None if codec == "none" else config.result_codec.to_json())
    return len(Updates(package, 1e-3).message(job))


def one_setting(package: Package, work: Path, args: argparse.Namespace, figures: Figures, *, mode: str,
                rounds: int | None, seconds: float | None) -> None:
    session = work / f"session-{figures.setting}"
    shutil.rmtree(session, ignore_errors=True)
    units = package.data.num_units
    passes = max(1, -(-(rounds + 4) * figures.k // units)) if rounds is not None else 50
    count = args.relays if figures.k != ANCHOR_K else 1  # (the first holds the session; the others serve beside
    # it: a synchronous session's replicas hand their results to it; the anchor is one relay's)
    with contextlib.ExitStack() as running:
        relays = [running.enter_context(RelayProcess(
            serve_command(package.path, session, figures.k, passes, args.codec, mode, figures.peers,
                          args.redundancy if figures.k != ANCHOR_K else 0.0, args.verify_trust, args.store,
                          args.async_validate_every if mode == "async" else 1, fresh=n == 0),
            log=work / f"serve-{figures.setting}-{n}.log", start_timeout_s=RELAY_START_SECONDS)) for n in range(count)]
        urls = [relay.page_url.rstrip("/") for relay in relays]
        print(f"{figures.setting}: relay{'s' if count > 1 else ''} at {', '.join(urls)}, {units} units, {passes} "
              f"passes, {figures.peers} peers", flush=True)
        idle = sum(relay.cpu_seconds() for relay in relays)  # (their start: imports, the session opened)
        honest = run_async(lambda: drive(urls, package, figures.peers, figures, args, rounds, seconds, work))
        figures.peak_rss_mb = max(relay.peak_rss_mb() for relay in relays)
        figures.relay_cpu_seconds = sum(relay.cpu_seconds() for relay in relays) - idle
    figures.relay_own = relay_own_seconds(args.store or session / "relay.sqlite3", figures.timed)
    if rounds is None:
        figures.units_lost = async_units_lost(args.store or session / "relay.sqlite3", honest)
        figures.units_checked = len(honest)
    shutil.rmtree(session, ignore_errors=True)
    first = statistics.fmean(figures.first_after_last) if figures.first_after_last else math.nan
    own = statistics.fmean(figures.relay_own) if figures.relay_own else math.nan
    print(f"{figures.setting}: relay after the last result {figures.relay_seconds:.3f} s (on its own clock, to the "
          f"next round's first lease {own:.3f} s; the first assignment {first:.3f} s; merge "
          f"{statistics.fmean(figures.merge) if figures.merge else math.nan:.3f} s), {figures.results_per_second:.0f} "
          f"results/s{merged(figures)}, work p50/p99 {figures.work_p50_ms:.0f}/{figures.work_p99_ms:.0f} ms, "
          f"result p50/p99 "
          f"{figures.result_p50_ms:.0f}/{figures.result_p99_ms:.0f} ms, peak RSS {figures.peak_rss_mb:.0f} MB, units "
          f"lost {lost(figures, 'not measured')}, refusals {figures.refusals or '-'}", flush=True)
    print(f"{figures.setting}: liars banned {liars(figures)} (with a result accepted), honest banned "
          f"{figures.honest_banned}, lies taken as results {figures.lies_accepted} (merged "
          f"{'-' if figures.lies_merged is None else figures.lies_merged}), copies {copy_share(figures)} of "
          f"the crowd's results, relay CPU {cpu_per_100(figures)} s per 100 results (the crowd's own "
          f"{cpu_per_100(figures, crowd=True)} s), disputes "
          f"{figures.disputes or '-'}", flush=True)


def run(args: argparse.Namespace) -> int:
    if args.relays < 1 or (args.relays > 1 and not is_server(args.store or "")):
        print("peertrain bench crowd: --relays N needs N >= 1, and past 1 a --store postgresql://... that they share",
              file=sys.stderr)
        return 2
    ks = [int(k) for k in str(args.ks).split(",") if k.strip()]
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="peertrain-bench-crowd-"))
    work.mkdir(parents=True, exist_ok=True)
    results: list[Figures] = []
    anchor: float | None = None
    try:
        chunks = max([55, *ks, args.async_k])
        package = build_package("bytetext", {"chunks": chunks}, work / "package", check=False, log=lambda _: None)
        if not args.skip_browser:
            anchor = browser_training_seconds(package, work)
            print(f"anchor: one bytetext unit trains in a browser peer in {anchor:.2f} s", flush=True)
        elif not args.skip_training:
            anchor = training_seconds(package)
            print(f"anchor: one bytetext unit trains natively in {anchor:.2f} s", flush=True)
        for k in [ANCHOR_K, *[k for k in ks if k != ANCHOR_K]]:
            peers = k if k == ANCHOR_K else max(k, args.peers)
            together = f", {args.relays} relays" if args.relays > 1 and k != ANCHOR_K else ""
            figures = Figures(setting=f"sync k={k}{together}", k=k, peers=peers, units=chunks)
            measured(one_setting, package, work, args, figures, mode="sync", rounds=args.rounds, seconds=None)
            results.append(figures)
        if args.async_k > 0:
            together = f", {args.relays} relays" if args.relays > 1 else ""
            figures = Figures(setting=f"async K={args.async_k}{together}", k=args.async_k, peers=args.peers,
                              units=chunks)
            if args.floor_seconds > 0:
                print(f"floor: a bare app under 50 clients for {args.floor_seconds:g} s", flush=True)
                try:
                    floor = upload_floor.measure(work / "floor", size=result_bytes(package, args.codec),
                                                 seconds=args.floor_seconds)
                    figures.floor_per_second = floor.per_second
                    print(f"floor: {floor.line()}", flush=True)
                except (OSError, httpx.HTTPError, RuntimeError) as failure:  # (the setting runs without its anchor)
                    print(f"floor: not measured: {type(failure).__name__}: {failure}", flush=True)
            measured(one_setting, package, work, args, figures, mode="async", rounds=None,
                     seconds=args.async_seconds)
            results.append(figures)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(results, anchor))
    for f in results:
        for error in f.errors:
            print(f"{f.setting}: {error}")
        goal = RELAY_SHARE_GOALS.get(f.k) if f.setting.startswith("sync") else None
        if goal is not None and anchor and not math.isnan(f.relay_seconds):
            share = f.relay_seconds / anchor
            print(f"{f.setting}: the relay's time after the last result is {share:.1%} of a "
                  f"{'browser' if not args.skip_browser else 'native'} unit ({anchor:.2f} s); "
                  f"{'meets' if share <= goal else 'misses'} the goal of at most {goal:.0%}")
        if f.setting.startswith("async") and f.floor_per_second:
            print(f"{f.setting}: {f.results_per_second:.0f} results/s taken{merged(f)}, "
                  f"{f.results_per_second / f.floor_per_second:.2f}x this machine's floor ({f.floor_per_second:.0f} "
                  f"uploads/s into a bare app that only stores them); the goal of {ASYNC_GOAL} results/s is "
                  f"{ASYNC_GOAL / f.floor_per_second:.2f}x that floor")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    anchor_kind = "browser" if not args.skip_browser else "native" if not args.skip_training else None
    args.out.write_text(json.dumps({"colluding": args.colluding, "anchor_seconds": anchor, "anchor": anchor_kind,
                                    "results": [{**asdict(f), "relay_seconds": f.relay_seconds} for f in results]},
                                   indent=1, default=float))
    print(f"figures: {args.out}")
    failed = [f for f in results if f.units_lost or f.errors or (f.honest_banned and not args.colluding)]
    return 1 if failed else 0
