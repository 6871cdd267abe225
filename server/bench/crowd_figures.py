"""``peertrain bench crowd``'s record: what the crowd saw (``Timeline``), the figures of one setting (``Figures``,
from the timeline and the relay's status and list of peers) and the table the bench prints."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server.relay.store.location import open_database
from server.relay.store.records import ASYNC_ROUND

ANCHOR_K = 5
LIES = ("free_rider", "flip")


@dataclass(frozen=True)
class Lie:
    """What a liar uploads for every unit: ``kind`` (``LIES``), scaled by 1 + ``own`` / 1000 (0: the kind's one lie,
    as every colluding liar sends)."""

    kind: str
    own: int = 0
@dataclass
class Timeline:
    """What the crowd saw, on the bench's clock."""

    started: float = field(default_factory=time.perf_counter)
    jobs: list[tuple[int, int, float]] = field(default_factory=list)  # (round, unit, received)
    results: list[tuple[int, int, float, float]] = field(default_factory=list)  # (round, unit, sent, answered)
    work_seconds: list[float] = field(default_factory=list)  # asks answered at once (no hold)
    # (peer, round, slot) per accepted upload, in order (a copy's job does not say it is one: the first accepted
    # upload of a slot is its result, the others are copies, and after a dispute the third peer's settles it)
    accepted: list[tuple[str | None, int, int]] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass
class Figures:
    setting: str
    k: int
    peers: int
    units: int
    rounds: int = 0
    relay_after_last: list[float] = field(default_factory=list)  # per timed round, validation excluded
    first_after_last: list[float] = field(default_factory=list)  # the same, until the next round's first assignment
    timed: dict[int, float] = field(default_factory=dict)  # timed round -> its validation's seconds
    relay_own: list[float] = field(default_factory=list)  # on the relay's clock (``relay_own_seconds``)
    validate: list[float] = field(default_factory=list)
    merge: list[float] = field(default_factory=list)
    results_per_second: float = 0.0
    merged_per_second: float = math.nan  # async: results merged by the time the crowd stopped, per second
    backlog: int | None = None  # async: results taken but waiting in the buffer then
    work_p50_ms: float = math.nan
    work_p99_ms: float = math.nan
    result_p50_ms: float = math.nan
    result_p99_ms: float = math.nan
    peak_rss_mb: float = math.nan
    units_lost: int | None = 0  # None: not measured (the store could not be read)
    units_checked: int | None = None  # async: the honest results looked for in the store (units_lost of them)
    liars: int = 0
    liars_accepted: int = 0  # liars with a result accepted (sync: in a merged round, whose checks are settled)
    liars_banned: int = 0
    honest_banned: int = 0
    lies_accepted: int = 0  # a liar's result taken as a slot's result (merged unless caught before the merge)
    lies_merged: int | None = None  # a liar's result in a merge (the relay's audit rows), an undo's taken out
    copies: int = 0  # second copies handed out
    copies_accepted: int = 0  # second copies uploaded and compared: volunteer compute spent on checking
    copies_late: float = math.nan  # copies per result in the second half of the rounds (past the newcomers' copies)
    results_accepted: int = 0
    verified_by_copies: int = 0  # results a copy agreed with, or a quorum settled
    disputes: dict[str, int] = field(default_factory=dict)  # the relay's counters of disputes and quorums
    relay_cpu_seconds: float = math.nan
    crowd_cpu_seconds: float = math.nan  # the bench process's own CPU (its thousand clients) over the setting
    floor_per_second: float | None = None  # async: a bare app's uploads/s on this machine (``upload_floor``)
    refusals: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def relay_seconds(self) -> float:
        return statistics.fmean(self.relay_after_last) if self.relay_after_last else math.nan


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else math.nan


def summarize(figures: Figures, timeline: Timeline, status: dict[str, Any], rounds: int | None) -> None:
    history = status["history"]
    figures.rounds = len(history)
    figures.refusals = {**timeline.refusals, **{k.removeprefix("refused."): v for k, v in status["counters"].items()
                                                 if k.startswith("refused.")}}
    figures.errors = timeline.errors
    figures.work_p50_ms, figures.work_p99_ms = (percentile(timeline.work_seconds, q) for q in (50, 99))
    answered = [end - sent for _, _, sent, end in timeline.results]
    figures.result_p50_ms, figures.result_p99_ms = (percentile(answered, q) for q in (50, 99))
    if timeline.results:
        first = min(sent for _, _, sent, _ in timeline.results)
        last = max(end for _, _, _, end in timeline.results)
        figures.results_per_second = len(timeline.results) / max(last - first, 1e-9)
    if rounds is None:  # (async: a unit is not handed out in a round, so there is no round's list to hold it to)
        figures.units_lost = None
        return
    # units lost: a unit handed out in a merged round is merged in some round or carried (a ban's undo carries the
    # banned peer's units of the rounds it redoes into the open round; the last redone round's entry lists them)
    merged = {entry["round"] for entry in history}
    accounted = {unit for entry in history for unit in [*entry.get("units", []), *entry.get("carried", [])]}
    figures.units_lost = len({unit for r, unit, _ in timeline.jobs if r in merged} - accounted)
    for entry in history[1:rounds + 1]:  # (round 0 waits for the crowd to join)
        r = entry["round"]
        last_result = max((end for rr, _, _, end in timeline.results if rr == r), default=math.nan)
        next_jobs = sorted(at for rr, _, at in timeline.jobs if rr == r + 1)
        if len(next_jobs) < figures.k or math.isnan(last_result):
            continue
        held = next_jobs[figures.k - 1]  # (the k-th assignment of the next round reached its peer)
        figures.validate.append(float(entry["seconds"]["validate"]))
        figures.merge.append(float(entry["seconds"]["merge"]))
        figures.relay_after_last.append(held - last_result - figures.validate[-1])
        figures.timed[r] = figures.validate[-1]
        figures.first_after_last.append(next_jobs[0] - last_result - figures.validate[-1])


def count_liars(figures: Figures, lies: dict[str | None, Lie | None], listing: list[dict[str, Any]],
                timeline: Timeline, status: dict[str, Any], audit: list[dict[str, Any]] | None = None) -> set[int]:
    """The liars' figures from the relay's list of peers (bans), its audit rows (``audit``: what merged, None where
    they were not read) and the crowd's own record (accepted results). Returns the slots whose result (the first
    accepted upload of a slot from its version) an honest peer sent: async, ``async_units_lost`` looks for each."""
    banned = {p["peer_id"] for p in listing if p["banned"]}
    liars = {peer for peer, lie in lies.items() if lie is not None}
    merged = status["round"] if status["mode"] == "sync" else None  # (sync: rounds before it merged, checks settled)
    if audit is not None:  # (async rows are merged arrivals; sync rows of merged rounds, an undo's marked undone)
        figures.lies_merged = sum(1 for row in audit if row["peer_id"] in liars and not str(
            row["verification"]).startswith("undone") and (merged is None or row["round"] < merged))
    accepted = {peer for peer, r, _ in timeline.accepted if merged is None or r < merged}
    figures.liars = len(liars)
    figures.liars_accepted = len(liars & accepted)
    figures.liars_banned = len(liars & banned)
    figures.honest_banned = len(banned - liars)
    firsts: dict[tuple[int, int], str | None] = {}
    for peer, r, slot in timeline.accepted:
        firsts.setdefault((r, slot), peer)
    figures.lies_accepted = sum(1 for (r, slot), peer in firsts.items() if peer in liars)
    honest = {slot for (_, slot), peer in firsts.items() if peer not in liars}
    figures.copies_accepted = len(timeline.accepted) - len(firsts)
    rounds_seen = sorted({r for _, r in firsts})
    if rounds_seen:
        half = rounds_seen[len(rounds_seen) // 2]
        late_results = sum(1 for r, _ in firsts if r >= half)
        late_copies = sum(1 for _, r, _ in timeline.accepted if r >= half) - late_results
        figures.copies_late = late_copies / late_results if late_results else math.nan
    counters = status["counters"]
    figures.copies = int(counters.get("copies_handed_out", 0))
    figures.results_accepted = int(counters.get("results_accepted", 0))
    figures.verified_by_copies = sum(int(counters.get(f"copies_{o}", 0)) for o in ("identical", "agreed")) + \
        int(counters.get("disputes_settled_by_quorum", 0))
    figures.disputes = {name: int(n) for name, n in sorted(counters.items())
                        if name.startswith(("disputes_", "quorums_")) or name == "copies_disputed"}
    return honest


def async_units_lost(store: str | Path, honest: set[int]) -> int | None:
    """Async units lost: of the schedule entries whose result an honest peer had accepted (``honest``), those the
    relay's store (a SQLite file or a PostgreSQL URL, read after the relay stopped) holds neither as an arrival,
    merged or waiting in the buffer, nor in a dispute its copies have not settled (a liar's copy that disagreed:
    the honest result waits out of the buffer for a third peer). An honest result is never dropped otherwise (only
    a ban takes a peer's arrivals out), so each one counted here was answered 200 and then went nowhere. None: the
    store could not be read."""
    database = open_database(store)
    if database is None:
        return None
    try:
        arrived = {int(row[0]) for row in database.run("SELECT entry FROM arrivals")}
        disputed = {int(row[0]) for row in database.run("SELECT slot FROM copies WHERE round = ? AND outcome = ?",
                                                        (ASYNC_ROUND, "unresolved"))}
    finally:
        database.close()
    return len(honest - arrived - disputed)


def liars(figures: Figures) -> str:
    return f"{figures.liars_banned}/{figures.liars_accepted}" + (f" of {figures.liars}" if figures.liars else "")


def copy_share(figures: Figures) -> str:
    accepted = figures.results_accepted
    late = "" if math.isnan(figures.copies_late) else f" (second half {figures.copies_late:.1%})"
    return f"{figures.copies_accepted / accepted:.1%}{late}" if accepted else "-"


def cpu_per_100(figures: Figures, *, crowd: bool = False) -> str:
    """The relay's CPU seconds per 100 accepted results (``crowd``: the bench process's, its simulated peers')."""
    accepted, seconds = figures.results_accepted, figures.crowd_cpu_seconds if crowd else figures.relay_cpu_seconds
    return f"{100 * seconds / accepted:.1f}" if accepted and not math.isnan(seconds) else "-"


def merged(figures: Figures) -> str:
    """Async: ``, N merged/s (B waiting)``: what the relay keeps up with, against what it takes."""
    if math.isnan(figures.merged_per_second):
        return ""
    return f", {figures.merged_per_second:.0f} merged/s ({figures.backlog} waiting at the end)"


def lost(figures: Figures, unmeasured: str) -> str:
    if figures.units_lost is None:
        return unmeasured
    return str(figures.units_lost) + ("" if figures.units_checked is None else f" of {figures.units_checked:,}")


COLUMNS = ("setting", "peers", "k", "rounds", "relay after the last result (s)", "share of a browser unit",
           "merge (s)", "relay peak RSS (MB)", "RSS vs k = 5", "results/s (async: merged/s)", "work p50/p99 (ms)",
           "result p50/p99 (ms)", "units lost", "liars banned", "honest banned", "copies", "relay CPU s / 100 results",
           "crowd CPU s / 100 results", "refusals")


def table(results: list[Figures], anchor: float | None) -> str:
    base = next((f.peak_rss_mb for f in results if f.k == ANCHOR_K and f.setting.startswith("sync")), math.nan)
    lines = ["| " + " | ".join(COLUMNS) + " |", "| " + " | ".join("---" for _ in COLUMNS) + " |"]
    for f in results:
        share = f"{f.relay_seconds / anchor:.1%}" if anchor and not math.isnan(f.relay_seconds) else "-"
        merge = f"{statistics.fmean(f.merge):.3f}" if f.merge else "-"
        relay = f"{f.relay_seconds:.3f}" if not math.isnan(f.relay_seconds) else "-"
        lines.append("| " + " | ".join([
            f.setting, str(f.peers), str(f.k), str(f.rounds), relay, share, merge, f"{f.peak_rss_mb:.0f}",
            f"{f.peak_rss_mb / base:.1f}x" if base == base else "-", f"{f.results_per_second:.0f}{merged(f)}",
            f"{f.work_p50_ms:.0f} / {f.work_p99_ms:.0f}", f"{f.result_p50_ms:.0f} / {f.result_p99_ms:.0f}",
            lost(f, "-"), liars(f), str(f.honest_banned), copy_share(f), cpu_per_100(f),
            cpu_per_100(f, crowd=True), ", ".join(f"{k} {v}" for k, v in sorted(f.refusals.items())) or "-"]) + " |")
    return "\n".join(lines)


def relay_own_seconds(store: str | Path, timed: dict[int, float]) -> list[float]:
    """The relay's own time after each timed round's last result, on its clock, from its store (a SQLite file or a
    PostgreSQL URL, read after the relay stopped): from the round's last result or copy stored before the next
    round's first lease to that lease, less the validation (the merge and the round's opening; a lease row keeps
    only its slot's latest grant, so the k-th grant is not in the store). What the crowd measures adds the hand-out
    of k assignments, both ends' HTTP and the bench's own event loop, which runs a thousand peers on the same two
    cores."""
    database = open_database(store) if timed else None
    if database is None:
        return []
    try:
        own = []
        for r, validate in sorted(timed.items()):
            first = database.run("SELECT MIN(issued) FROM leases WHERE round = ? AND copy = 0", (r + 1,))[0][0]
            if first is None:
                continue
            last = database.run("SELECT MAX(received) FROM (SELECT received FROM results WHERE round = ? UNION ALL "
                                "SELECT received FROM copies WHERE round = ?) AS stored WHERE received <= ?",
                                (r, r, first))[0][0]  # (a backup's copy may come after the merge: compared)
            if last is not None:
                own.append(float(first) - float(last) - validate)
        return own
    finally:
        database.close()
