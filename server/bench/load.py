"""``peertrain bench load``: many peers and many pages against one real relay for minutes, plus slow clients.

Nobody had run many peers for long: this shows whether the relay's memory stays flat, how fast it answers under
load, whether a unit can get lost, and whether slow or silent clients can hold a round or the event loop.

A real ``peertrain serve`` subprocess on 127.0.0.1 (port 0) serves the majority example (``majority_task``,
imported as a module so that ``serve`` does not rebuild the shared ``wheels/`` folder): 100 chunks of 64 rows,
1 local epoch (a unit trains natively in a few milliseconds, so the relay, not the training, is what is
measured), k = peers / 4 units a round (50 for 200 peers), enough passes that the session outlasts the run.
Backups and host replays stay at ``serve``'s defaults (backups after 1x the median unit time; replays of each
peer's first result and 10% of the rest: a majority unit replays in milliseconds, so replays do not make the
relay CPU-bound); joins are unlimited per address (every simulated peer comes from 127.0.0.1);
``--min-peers 1`` lets the single-peer anchor train alone before the crowd joins.

In the bench process, on one asyncio loop, over loopback:

* ``--peers`` simulated peers (httpx.AsyncClient, one shared pool) do what the page's worker does: join, hold-poll
  ``POST /api/work?hold=S`` (S: the relay's ``limits.hold_seconds``), fetch the weights and the unit, train,
  upload. Training is real (``runtime.peer.Peer``), computed once per (round, unit) and cached: a backup of a
  unit trains the same unit from the same weights, which gives the same bytes, so the cached result is that
  peer's honest result and passes every check and replay. A browser's compute time is simulated by sleeping
  ``--unit-seconds`` x uniform(0.5, 1.5) per unit. After each upload a peer first asks ``POST /api/work``
  without hold: that request is answered at once, so its latency is the relay's ("work" below); held polls
  wait for a round by design and are counted, not timed.
* ``--watchers`` page watchers hold ``GET /api/events`` open (raw streams, chunked encoding decoded) and read
  every event; the bench records when each watcher first sees each round.
* Slow clients, during the middle third of the run: ``--tricklers`` peers that train a unit honestly and upload
  it ``--trickle-rate`` bytes a second (the relay must answer ``408 body_timeout`` at ``--body-timeout`` and a
  backup must take the unit); ``--silent`` connections that open and send nothing (closed at the relay's
  ``--header-timeout``); ``--head-tricklers`` connections that send a request head a byte a second (408
  ``header_timeout``).

Reported, with a progress line every ~30 s: the relay's RSS (``/proc/<pid>/status`` VmRSS, every second) and its
least-squares slope after a warm-up, as MB/min and as % of the RSS at the warm-up's end per minute; p50/p99 of
work (answered at once) and result requests, beside the single-peer figures of the same run (one peer alone,
``--anchor-units`` units, before the crowd joins) and split into with and without slow clients; rounds per
minute beside the bound a unit's time sets; units lost (a unit handed out in a merged round that is neither in
that round's merged units nor carried to the next; and any gap or missing unit in the session history: must
be 0); refusals by code (the relay's counters) and the answers the bench got by status; how long after the first
watcher the last one saw each new round. Figures go to ``--out`` as JSON.

``server.bench.load_clients`` holds the clients, ``server.bench.load_figures`` the measurements and the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path

import httpx

from server.bench.load_clients import (
    KEEP,
    Crowd,
    LoadSettings,
    Recorder,
    SlowFigures,
    Trainer,
    WatcherFigures,
    head_trickler,
    measure_lag,
    silent,
    sim_peer,
    trickler,
    watcher,
)
from server.bench.load_figures import (
    LoadFigures,
    cpu_share,
    figures_of,
    longest_round,
    lost_units,
    ms,
    percentiles,
    relay_process,
    report,
    round_times,
    rounds_between,
    sample_rss,
    slope_per_minute,
)
from server.harness.peer import pooled, run_async
from server.harness.relay_process import EXAMPLES, RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.options import DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, RelayOptions, ServerLimits
from server.session.config import SessionConfig

TASK = "majority_task:MajorityTask"  # examples/majority_task.py, importable with examples/ on the path
ADMIN = "bench-load"
PROGRESS_SECONDS = 30.0
STOP_GRACE_SECONDS = 5.0  # after the held polls' longest hold: then whatever is left is cancelled


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=200, help="simulated peers (default 200)")
    parser.add_argument("--watchers", type=int, default=200, help="page watchers on /api/events (default 200)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the crowd runs (default 10)")
    parser.add_argument("-k", "--participants", type=int, default=None, help="units a round (default peers / 4)")
    parser.add_argument("--chunks", type=int, default=100, help="units a pass (default 100)")
    parser.add_argument("--rows", type=int, default=64, help="rows of bits a unit (default 64)")
    parser.add_argument("--unit-seconds", type=float, default=2.0,
                        help="a browser's simulated compute time a unit, times uniform(0.5, 1.5) (default 2)")
    parser.add_argument("--anchor-units", type=int, default=30, help="units the single peer trains alone (30)")
    parser.add_argument("--tricklers", type=int, default=5, help="peers uploading a trickle (default 5)")
    parser.add_argument("--trickle-rate", type=int, default=4, help="their bytes a second (default 4)")
    parser.add_argument("--silent", type=int, default=20, help="connections that send nothing (default 20)")
    parser.add_argument("--head-tricklers", type=int, default=5,
                        help="connections trickling a request head a byte a second (default 5)")
    parser.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT, help="serve --body-timeout")
    parser.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT,
                        help="serve --header-timeout")
    parser.add_argument("--warm-up", type=float, default=None,
                        help="seconds before the memory slope starts (default 60, at most a fifth of the run)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="one more `peertrain serve` argument (repeat; e.g. --serve-arg=--no-backups)")
    parser.add_argument("--profile", type=Path, help="run the relay under cProfile, stats written here")
    parser.add_argument("--work-dir", type=Path, help="the session folder's parent (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/load.json"), help="figures as JSON")


def settings_from_args(args: argparse.Namespace) -> LoadSettings:
    seconds = args.minutes * 60
    return LoadSettings(peers=args.peers, watchers=args.watchers, minutes=args.minutes,
                        k=args.participants or max(1, args.peers // 4), chunks=args.chunks, rows=args.rows,
                        unit_seconds=args.unit_seconds, anchor_units=args.anchor_units, tricklers=args.tricklers,
                        trickle_rate=args.trickle_rate, silent=args.silent, head_tricklers=args.head_tricklers,
                        body_timeout=args.body_timeout, header_timeout=args.header_timeout,
                        warm_up=args.warm_up if args.warm_up is not None else min(60.0, seconds / 5),
                        serve_args=tuple(args.serve_arg), profile=args.profile)


def serve_command(settings: LoadSettings, session_dir: Path) -> ServeCommand:
    """The relay under load; ``settings.serve_args`` (the user's ``--serve-arg``) come last, as typed."""
    task_settings = {"chunks": settings.chunks, "examples": settings.chunks * settings.rows, "epochs": 1}
    # every simulated peer joins from 127.0.0.1: no admission limit per address here
    options = RelayOptions(admin_token=ADMIN, min_peers=1, join_rate=0.0, max_peers_per_address=0)
    limits = ServerLimits(body_timeout=settings.body_timeout, header_timeout=settings.header_timeout)
    return ServeCommand(task=TASK, task_settings=task_settings, session_dir=session_dir, fresh=True,
                        config=SessionConfig(participants=settings.k, passes=settings.passes()), options=options,
                        limits=limits, extra=("--host", "127.0.0.1", *settings.serve_args))


# ---------------------------------------------------------------- the run


async def progress(crowd: Crowd, rss: list[tuple[float, float]], cpu: list[tuple[float, float, float]],
                   watchers: WatcherFigures, slow: SlowFigures) -> None:
    recorder, last = crowd.recorder, 0.0
    while await crowd.sleep(PROGRESS_SECONDS):
        now = recorder.now()
        window = figures_of(recorder, last, now)
        status = (await crowd.client.get("/api/session")).json()
        five = sum(n for answer, n in recorder.answers.items() if answer[:1] == "5")
        errors = sum(n for answer, n in recorder.answers.items() if answer.startswith("transport"))
        relay_cpu, bench_cpu = cpu_share(cpu, last, now)
        print(f"  [{now:4.0f} s] round {status['round']}, RSS {rss[-1][1] if rss else float('nan'):.1f} MB, CPU "
              f"relay {relay_cpu:.0%} bench {bench_cpu:.0%}, "
              f"{sum(recorder.answers.values())} answers ({five} 5xx, {errors} transport errors); last "
              f"{now - last:.0f} s: work p50/p99 {ms(window.get('work', percentiles([]))['p50'])}/"
              f"{ms(window.get('work', percentiles([]))['p99'])} ms, result p50/p99 "
              f"{ms(window.get('result', percentiles([]))['p50'])}/{ms(window.get('result', percentiles([]))['p99'])}"
              f" ms; {watchers.events} events to watchers; slow clients "
              f"{'on' if crowd.slow.is_set() else 'off'} ({len(slow.trickled)} trickled uploads answered, "
              f"{len(slow.silent_closed)} silent connections closed)", flush=True)
        last = now


async def slow_window(crowd: Crowd) -> None:
    start, end = crowd.settings.slow_window
    if not await crowd.sleep(start):
        return
    crowd.slow.set()
    print(f"  [{crowd.recorder.now():4.0f} s] slow clients start", flush=True)
    await crowd.sleep(end - start)
    crowd.slow.clear()
    print(f"  [{crowd.recorder.now():4.0f} s] slow clients stop", flush=True)


async def drive(relay: RelayProcess, settings: LoadSettings) -> LoadFigures:
    host, port = relay.host_port
    connections = settings.peers + settings.tricklers + 20
    limits = pooled(connections)
    async with httpx.AsyncClient(base_url=relay.url, timeout=120, limits=limits) as client:
        task_info = (await client.get("/api/task")).json()
        hold = float(task_info["limits"]["hold_seconds"])
        recorder = Recorder()
        crowd = Crowd(client, Trainer(task_info, keep=KEEP), recorder, settings, hold, asyncio.Event(), host, port)

        # The anchor: one peer alone on the relay (``--min-peers 1``), no compute time.
        await sim_peer(crowd, -1, anchor_units=settings.anchor_units)
        anchor = figures_of(recorder, 0.0)
        print("  single peer alone: " + ", ".join(f"{kind} p50 {ms(f['p50'])} ms, p99 {ms(f['p99'])} ms"
                                                for kind, f in anchor.items() if kind != "join"), flush=True)

        recorder.started, recorder.latencies = time.perf_counter(), defaultdict(list)
        recorder.answers.clear()
        start_wall = time.time()
        rss: list[tuple[float, float]] = []
        cpu: list[tuple[float, float, float]] = []
        watchers, slow = WatcherFigures(), SlowFigures()
        sampler_stop = asyncio.Event()
        sampler = asyncio.create_task(sample_rss(relay.pid, recorder, rss, cpu, sampler_stop))
        lags: list[float] = []
        lag_probe = asyncio.create_task(measure_lag(lags, sampler_stop))
        tasks = [asyncio.create_task(watcher(crowd, watchers)) for _ in range(settings.watchers)]
        tasks += [asyncio.create_task(sim_peer(crowd, i)) for i in range(settings.peers)]
        tasks += [asyncio.create_task(trickler(crowd, i, slow)) for i in range(settings.tricklers)]
        tasks += [asyncio.create_task(silent(crowd, slow)) for _ in range(settings.silent)]
        tasks += [asyncio.create_task(head_trickler(crowd, slow)) for _ in range(settings.head_tricklers)]
        helpers = [asyncio.create_task(progress(crowd, rss, cpu, watchers, slow)),
                   asyncio.create_task(slow_window(crowd))]
        print(f"  crowd: {settings.peers} peers, {settings.watchers} watchers for {settings.minutes:g} min; slow "
              f"clients from {settings.slow_window[0]:.0f} s to {settings.slow_window[1]:.0f} s", flush=True)
        await crowd.sleep(settings.seconds)  # (returns at the deadline: nothing sets stop before)
        crowd.stop.set()
        crowd.slow.clear()
        ended = recorder.now()
        _, pending = await asyncio.wait(tasks + helpers, timeout=hold + STOP_GRACE_SECONDS)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        sampler_stop.set()
        await asyncio.gather(sampler, lag_probe)

        status = (await client.get("/api/session")).json()
        exported = await client.get("/api/admin/export/history", headers={"Authorization": f"Bearer {ADMIN}"})
        history = [json.loads(line) for line in exported.text.splitlines() if line.strip()]

    warm = settings.warm_up
    window = settings.slow_window
    times = round_times(history, start_wall)
    after_warm = [(t, mb) for t, mb in rss if t >= warm] or rss
    lost, gaps, missing = lost_units(history, recorder.handed_out)
    rounds_after_warm = len([t for _, t in times if warm <= t <= ended])
    seen_by_all = [times for times in watchers.seen.values() if len(times) >= 2]
    spreads = [max(times) - min(times) for times in seen_by_all]
    answers = dict(recorder.answers)
    counters = dict(status.get("counters", {}))
    merged_units = {int(entry["round"]): set(entry["units"]) for entry in history}
    trickled = [(r, u) for r, u in slow.trickled_units if r in merged_units]  # (a round still open at the end: not)
    trickled_merged = sum(1 for r, u in trickled if u in merged_units[r])
    return LoadFigures(
        settings=asdict(settings) | {"profile": str(settings.profile) if settings.profile else None},
        anchor=anchor, latency=figures_of(recorder, warm, ended),
        latency_slow=figures_of(recorder, window[0], window[1]),
        latency_calm=figures_of(recorder, warm, ended, outside=window),
        rss=rss, cpu_relay=cpu_share(cpu, warm, ended)[0], cpu_bench=cpu_share(cpu, warm, ended)[1],
        bench_lag=percentiles(lags),
        rss_per_round_mb=(after_warm[-1][1] - after_warm[0][1]) / max(1, rounds_after_warm) if after_warm
        else float("nan"),
        rss_start=after_warm[0][1] if after_warm else float("nan"),
        rss_slope_mb_per_min=slope_per_minute(after_warm),
        rounds=len([t for _, t in times if 0 <= t <= ended]),
        rounds_per_minute=rounds_between(times, 0.0, ended),
        rounds_per_minute_slow=rounds_between(times, *window),
        rounds_per_minute_calm=(len([t for _, t in times if warm <= t < ended and not window[0] <= t < window[1]])
                                / max(1e-9, (ended - warm - (window[1] - window[0])) / 60)),
        longest_round_slow=longest_round(times, *window),
        longest_round_calm=max(longest_round(times, warm, window[0]), longest_round(times, window[1], ended)),
        units_lost=lost, history_gaps=gaps, history_missing=missing, handed_out=len(recorder.handed_out),
        refusals={name.removeprefix("refused."): n for name, n in counters.items() if name.startswith("refused.")},
        answers=answers, five_xx=sum(n for a, n in answers.items() if a[:1] == "5"),
        transport_errors=sum(n for a, n in answers.items() if a.startswith("transport")),
        held_polls=recorder.held_polls, units_trained=recorder.units_trained,
        trained_cache_hits=recorder.trained_cache_hits, units_uploaded=recorder.units_uploaded,
        backups=recorder.backups,
        watchers={"events": watchers.events, "bytes": watchers.bytes, "keep_alives": watchers.keep_alives,
                  "failures": dict(watchers.failures), "rounds_seen": len(watchers.seen),
                  "event_bytes": sorted(watchers.sizes.items()),
                  "spread": percentiles(spreads)},
        slow={"trickled": dict(Counter(answer for answer, _, _ in slow.trickled)),
              "trickle_seconds": percentiles([s for _, s, _ in slow.trickled]),
              "trickled_bytes": sum(sent for _, _, sent in slow.trickled),
              "trickled_units": len(trickled), "trickled_units_merged": trickled_merged,
              "silent_closed": percentiles([s for s in slow.silent_closed if math.isfinite(s)]),
              "silent_never_closed": sum(1 for s in slow.silent_closed if not math.isfinite(s)),
              "heads": dict(Counter(answer for answer, _ in slow.heads)),
              "head_seconds": percentiles([s for _, s in slow.heads])},
        counters=counters)


def run_load(settings: LoadSettings, work: Path) -> LoadFigures:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # the trainer imports the task as the relay does
    with relay_process(serve_command(settings, work / "session"), work / "serve.log", settings.profile) as relay:
        print(f"relay at {relay.url} (pid {relay.pid}): {TASK}, {settings.chunks} units of {settings.rows} rows, "
              f"k = {settings.k}, {settings.passes()} passes; log {relay.log}", flush=True)
        return run_async(lambda: drive(relay, settings))


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="peertrain-bench-load-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        figures = run_load(settings, work)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print()
    for line in report(figures, settings):
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(figures), indent=1, default=str))
    print(f"figures: {args.out}")
    failed = figures.units_lost or figures.history_gaps or figures.history_missing or figures.five_xx
    if failed:
        print("FAILED: units lost, a gap in the history or a 5xx answer (see above)")
    return 1 if failed else 0


__all__ = ["EXAMPLES", "LoadFigures", "LoadSettings", "add_arguments", "relay_process", "report", "run", "run_load"]
