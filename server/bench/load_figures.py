"""``peertrain bench load``'s measurements: the relay process and its RSS and CPU, and the figures of a run.

``LoadFigures`` is what a run found; ``report`` prints it, each figure beside its anchor.
"""

from __future__ import annotations

import asyncio
import math
import os
import resource
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.bench.load_clients import LoadSettings, Recorder
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand

RSS_SAMPLE_SECONDS = 1.0


# ---------------------------------------------------------------- the relay under test


@contextmanager
def relay_process(serve: ServeCommand, log: Path, profile: Path | None = None) -> Iterator[RelayProcess]:
    """``peertrain serve`` in a child process (``server.harness.RelayProcess``, examples/ on its path), its output
    in ``log``; stopped after. With ``profile``, under cProfile, stopped with SIGINT: uvicorn re-raises the signal
    it shut down on, and SIGTERM's default action would lose cProfile's stats where a KeyboardInterrupt lets
    cProfile write them on its way out."""
    python = [sys.executable, "-m", "cProfile", "-o", str(profile)] if profile else None
    with RelayProcess(serve, log=log, examples=True, python=python,
                      stop_signal=signal.SIGINT if profile else signal.SIGTERM, stop_timeout_s=30) as relay:
        yield relay


def rss_mb(pid: int) -> float | None:
    """The resident set of process ``pid`` in MB (VmRSS), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far (``/proc/<pid>/stat``), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # (utime, stime: fields 14, 15)


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_share(samples: list[tuple[float, float, float]], since: float, until: float) -> tuple[float, float]:
    """Mean CPU use of (the relay, this bench) between ``since`` and ``until``, as a share of one core."""
    inside = [s for s in samples if since <= s[0] <= until]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan"), float("nan")
    wall = inside[-1][0] - inside[0][0]
    return (inside[-1][1] - inside[0][1]) / wall, (inside[-1][2] - inside[0][2]) / wall


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 2:
        return float("nan")
    t = np.array([s for s, _ in samples])
    y = np.array([mb for _, mb in samples])
    return float(np.polyfit(t, y, 1)[0] * 60)


# ---------------------------------------------------------------- the figures


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    array = np.array(values)
    return {"n": len(values), "p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99)),
            "max": float(array.max())}


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{1e3 * value:.1f}"


@dataclass
class LoadFigures:
    settings: dict[str, Any]
    anchor: dict[str, dict[str, float]]  # kind -> percentiles, the single peer alone
    latency: dict[str, dict[str, float]]  # kind -> percentiles, the crowd (after warm-up)
    latency_slow: dict[str, dict[str, float]]  # while the slow clients ran
    latency_calm: dict[str, dict[str, float]]  # after warm-up, outside the slow clients' window
    rss: list[tuple[float, float]]  # (seconds since the crowd started, MB)
    cpu_relay: float  # the relay's mean CPU use after the warm-up, as a share of one core
    cpu_bench: float  # this bench's
    bench_lag: dict[str, float]  # how late the bench's loop woke a 0.1 s sleep (added to what it times)
    rss_per_round_mb: float  # RSS growth after the warm-up per round merged meanwhile
    rss_start: float
    rss_slope_mb_per_min: float
    rounds: int
    rounds_per_minute: float
    rounds_per_minute_slow: float
    rounds_per_minute_calm: float
    longest_round_slow: float
    longest_round_calm: float
    units_lost: int
    history_gaps: int
    history_missing: int
    handed_out: int
    refusals: dict[str, int]
    answers: dict[str, int]
    five_xx: int
    transport_errors: int
    held_polls: int
    units_trained: int
    trained_cache_hits: int
    units_uploaded: int
    backups: int
    watchers: dict[str, Any]
    slow: dict[str, Any]
    counters: dict[str, int]

    @property
    def rss_slope_share(self) -> float:
        return self.rss_slope_mb_per_min / self.rss_start if self.rss_start else float("nan")


def figures_of(recorder: Recorder, since: float, until: float = float("inf"),
               outside: tuple[float, float] | None = None) -> dict[str, dict[str, float]]:
    return {kind: percentiles([latency for at, latency in values if since <= at < until and (
        outside is None or not outside[0] <= at < outside[1])]) for kind, values in recorder.latencies.items()}


def round_times(history: list[dict[str, Any]], start_wall: float) -> list[tuple[int, float]]:
    """(round, seconds since the crowd started when it merged) from the history's wall-clock times."""
    return [(int(entry["round"]), float(entry["time"]) - start_wall) for entry in history]


def rounds_between(times: list[tuple[int, float]], since: float, until: float) -> float:
    merged = [at for _, at in times if since <= at < until]
    return len(merged) / ((until - since) / 60) if until > since else float("nan")


def longest_round(times: list[tuple[int, float]], since: float, until: float) -> float:
    gaps = [b - a for (_, a), (_, b) in zip(times, times[1:], strict=False) if since <= b < until]
    return max(gaps) if gaps else float("nan")


def lost_units(history: list[dict[str, Any]], handed_out: set[tuple[int, int, int]]) -> tuple[int, int, int]:
    """(units lost, gaps in the history's rounds, units the history says a round missed)."""
    rounds = [int(entry["round"]) for entry in history]
    gaps = sum(1 for expected, got in enumerate(rounds) if expected != got)
    missing = sum(len(entry.get("missing") or []) - len(entry.get("carried") or []) for entry in history)
    merged = {int(entry["round"]): set(entry["units"]) | set(entry.get("carried") or []) for entry in history}
    lost = sum(1 for round_index, _, unit in handed_out if round_index in merged and unit not in merged[round_index])
    return lost, gaps, missing


async def sample_rss(pid: int, recorder: Recorder, samples: list[tuple[float, float]],
                     cpu: list[tuple[float, float, float]], stop: asyncio.Event) -> None:
    """Every second: the relay's RSS, and the CPU time of the relay and of this bench."""
    while not stop.is_set():
        value, used = rss_mb(pid), cpu_seconds(pid)
        if value is not None and used is not None:
            samples.append((recorder.now(), value))
            cpu.append((recorder.now(), used, own_cpu_seconds()))
        try:
            await asyncio.wait_for(stop.wait(), timeout=RSS_SAMPLE_SECONDS)
        except TimeoutError:
            pass


def report(f: LoadFigures, settings: LoadSettings) -> list[str]:
    """The figures, each beside its anchor."""
    lines = []
    slope, share = f.rss_slope_mb_per_min, f.rss_slope_share
    rss_values = [mb for _, mb in f.rss]
    lines.append(f"relay memory (VmRSS, {len(f.rss)} samples): {f.rss_start:.1f} MB at {settings.warm_up:.0f} s "
                 f"(after the warm-up), {rss_values[-1] if rss_values else float('nan'):.1f} MB at the end, max "
                 f"{max(rss_values, default=float('nan')):.1f} MB; slope after the warm-up {slope:+.3f} MB/min = "
                 f"{share:+.2%} of that RSS per minute")
    lines.append(f"  = {f.rss_per_round_mb * 1e3:+.0f} kB per round merged after the warm-up")
    lines.append(f"CPU after the warm-up: the relay {f.cpu_relay:.0%} of one core, this bench {f.cpu_bench:.0%} "
                 f"(of {os.cpu_count()} cores); the bench's own loop woke a 0.1 s sleep {ms(f.bench_lag['p50'])} ms "
                 f"(p50) / {ms(f.bench_lag['p99'])} ms (p99) late, which every latency below includes")
    lines.append("latency (ms)          crowd p50 / p99 / max (n)        single peer p50 / p99   "
                 "slow clients on p50 / p99   off p50 / p99")
    for kind in ("work", "result", "weights", "unit", "join"):
        crowd = f.latency.get(kind, percentiles([]))
        alone = f.anchor.get(kind, percentiles([]))
        on, off = f.latency_slow.get(kind, percentiles([])), f.latency_calm.get(kind, percentiles([]))
        lines.append(f"  {kind:8s}  {ms(crowd['p50']):>8s} / {ms(crowd['p99']):>7s} / {ms(crowd['max']):>7s} "
                     f"({crowd['n']:>6d})   {ms(alone['p50']):>8s} / {ms(alone['p99']):>7s}    "
                     f"{ms(on['p50']):>8s} / {ms(on['p99']):>7s}      {ms(off['p50']):>7s} / {ms(off['p99']):>7s}")
    bound = 60 / settings.unit_seconds
    lines.append(f"rounds: {f.rounds} in {settings.minutes:g} min = {f.rounds_per_minute:.1f}/min (k = {settings.k}; "
                 f"a round lasts at least about one unit time, {settings.unit_seconds:g} s: at most ~{bound:.0f}/min); "
                 f"{f.rounds_per_minute_slow:.1f}/min with slow clients, {f.rounds_per_minute_calm:.1f}/min without; "
                 f"longest round {f.longest_round_slow:.1f} s with them, {f.longest_round_calm:.1f} s without "
                 f"(body timeout {settings.body_timeout:g} s)")
    lines.append(f"units lost: {f.units_lost} of {f.handed_out} handed out (history: {f.history_gaps} gaps, "
                 f"{f.history_missing} units missing); {f.units_uploaded} results accepted, {f.backups} backups "
                 f"handed out, {f.units_trained} units trained ({f.trained_cache_hits} results reused by a backup "
                 f"of the same unit), {f.held_polls} held polls")
    lines.append("refusals by code (the relay's counters): " + (", ".join(
        f"{code} {n}" for code, n in sorted(f.refusals.items())) or "none"))
    lines.append("answers the crowd got: " + ", ".join(f"{a} {n}" for a, n in sorted(f.answers.items()))
                 + f"; 5xx: {f.five_xx}, transport errors: {f.transport_errors}")
    w = f.watchers
    lines.append(f"watchers: {settings.watchers} streams read {w['events']} events ({w['bytes'] / 1e6:.1f} MB, "
                 f"{w['keep_alives']} keep-alives), {w['rounds_seen']} rounds seen; the last watcher saw a new round "
                 f"{ms(w['spread']['p50'])} ms (p50) / {ms(w['spread']['p99'])} ms (p99) after the first; failures "
                 f"{w['failures'] or 'none'}")
    if w["event_bytes"]:
        (first_round, first_size), (last_round, last_size) = w["event_bytes"][0], w["event_bytes"][-1]
        lines.append(f"  one event (the session status) was {first_size / 1e3:.1f} kB at round {first_round} and "
                     f"{last_size / 1e3:.1f} kB at round {last_round}")
    s = f.slow
    lines.append(f"tricklers ({settings.tricklers}, {settings.trickle_rate} B/s): {dict(s['trickled'])} after "
                 f"{s['trickle_seconds']['p50']:.1f} s (p50) / {s['trickle_seconds']['max']:.1f} s (max) "
                 f"against --body-timeout {settings.body_timeout:g} s; {s['trickled_units_merged']} of their "
                 f"{s['trickled_units']} units in merged rounds merged from another peer's result")
    lines.append(f"silent connections ({settings.silent}): {s['silent_closed']['n']} closed by the relay after "
                 f"{s['silent_closed']['p50']:.1f} s (p50) / {s['silent_closed']['max']:.1f} s (max), "
                 f"{s['silent_never_closed']} never; head tricklers ({settings.head_tricklers}): {dict(s['heads'])} "
                 f"after {s['head_seconds']['p50']:.1f} s (p50) against --header-timeout {settings.header_timeout:g} s")
    return lines
