"""The report of ``peertrain bench attacks``: comparisons with the honest anchors, progress lines, Markdown tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = ("aggregator", "attack", "attackers", "metric", "vs honest, same aggregator", "vs honest mean",
           "rounds", "refused by the relay", "peers banned", "joins refused", "merge ms", "relay s/round", "run s")


def relative(value: float | None, anchor: float | None, points: bool) -> float | None:
    """Points (value - anchor, x100) for a 0-1 metric where higher is better; else the ratio value / anchor."""
    if value is None or anchor is None:
        return None
    if points:
        return 100.0 * (value - anchor)
    return value / anchor if anchor else None


def shown(change: float | None, points: bool) -> str:
    if change is None:
        return "-"
    return f"{change:+.1f} pts" if points else f"{change:.3f}x"


def compare(records: Sequence[Any], tasks: Mapping[str, Any]) -> None:
    """Fill ``vs_honest`` and ``vs_mean`` of every record whose anchors have run: the honest run of the same
    task, aggregator and relay checks, and the honest run of mean (plain FedAvg) with those checks."""
    honest = {r.key: r for r in records if r.attack == "none" and r.value is not None}
    for record in records:
        points = tasks[record.task].points
        same, mean = honest.get(record.key), honest.get((record.task, "mean", record.checks))
        record.vs_honest = relative(record.value, same.value if same else None, points)
        record.vs_mean = relative(record.value, mean.value if mean else None, points)


def codes(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{code} {n}" for code, n in sorted(counts.items())) or "-"


def join_refusals(record: Any) -> str:
    refused = {key.split(" ", 1)[1].removeprefix("refused."): n for key, n in record.joins.items()
               if " refused." in key}
    return codes(refused)


def attackers_cell(record: Any) -> str:
    if record.attack == "sybil":
        tried = sum(n for key, n in record.joins.items() if key.startswith("sybil "))
        return f"{record.attackers} of {tried} joins"
    return str(record.attackers)


def aggregator_cell(record: Any) -> str:
    """``default (trimmed_mean fraction 0.333)`` for the relay's default; an asked name as it is."""
    if record.aggregator != "default" or not record.relay_aggregator:
        return str(record.aggregator)
    settings = " ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in record.relay_aggregator_config.items() if v is not None)
    return f"default ({record.relay_aggregator}{' ' + settings if settings else ''})"


def number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_progress(record: Any) -> None:
    outcome = record.error or (f"{record.metric}={number(record.value, 4)}, {record.rounds}/{record.num_rounds} "
                               f"rounds, refused: {codes(record.refusals)}")
    setup = f"checks {record.checks}" + (f", honest first {record.honest_first}" if record.honest_first else "")
    print(f"{record.task:8s} {record.aggregator:17s} {record.attack:16s} {record.fraction:4.2f} "
          f"({attackers_cell(record)}; {setup}): {outcome}; {record.seconds:.1f} s", flush=True)


def row(record: Any, points: bool) -> str:
    if record.error:
        return (f"| {record.aggregator} | {record.attack} | {attackers_cell(record)} | error: "
                f"{record.error[:80].replace('|', '/')} |" + " - |" * (len(COLUMNS) - 4))
    value = "-" if record.value is None else (f"{100 * record.value:.1f}%" if points else f"{record.value:.4f}")
    rounds = f"{record.rounds}/{record.num_rounds}" + (" (stopped)" if record.stopped else "")
    merge = "-" if record.merge_s is None else f"{1e3 * record.merge_s:.1f}"
    cells = [aggregator_cell(record), record.attack, attackers_cell(record), value, shown(record.vs_honest, points),
             shown(record.vs_mean, points), rounds, codes(record.refusals),
             str(record.counters.get("peers_banned", 0)), join_refusals(record), merge,
             number(record.relay_round_s, 2), f"{record.seconds:.1f}"]
    return "| " + " | ".join(cells) + " |"


def tables(shown: Sequence[tuple[Any, Sequence[Any]]], tasks: Mapping[str, Any], features: Any) -> str:
    """One Markdown table per section of the grid (the honest runs appear in each section that uses them)."""
    out = []
    for section, rows in shown:
        grid = tasks[section.task]
        metric = f"{grid.metric} ({'exact answers' if grid.points else 'lower is better'})"
        out.append(f"### {section.task}, {section.title}: final {metric}")
        out.append("")
        out.append("| " + " | ".join(metric if c == "metric" else c for c in COLUMNS) + " |")
        out.append("|" + " --- |" * 3 + " ---: |" * (len(COLUMNS) - 3))
        out += [row(r, grid.points) for r in rows]
        out.append("")
    if not getattr(features, "aggregate", False):
        out.append("This relay has no --aggregate: `mean` and `default` are its plain FedAvg.")
    return "\n".join(out).rstrip() + "\n"
