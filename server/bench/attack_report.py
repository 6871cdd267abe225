"""The report of ``peertrain bench attacks``: comparisons with the honest anchors, progress lines, Markdown tables.

A section that crosses host replay shares (``verify_shares``) gets its own columns (``VERIFY_COLUMNS``): the
attackers the relay banned of those that attacked, the round each was banned in, the honest peers banned (0,
or a WARNING line), the replays' added time (the history's ``verification.waited_seconds``, the time a merge
waited for its round's replays, mean per round) and the session's wall time per round, also as a ratio to the
same run at share 0 (``--no-verify``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = ("aggregator", "attack", "attackers", "metric", "vs honest, same aggregator", "vs honest mean",
           "rounds", "refused by the relay", "peers banned", "joins refused", "merge ms", "relay s/round", "run s")
VERIFY_COLUMNS = ("replay share", "attack", "attackers", "metric", "vs honest, same share", "rounds",
                  "attackers caught", "round of each ban", "honest banned", "refused by the relay", "replays",
                  "replay wait s/round", "wall s/round", "wall vs share 0", "run s")


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
    """Fill ``vs_honest``, ``vs_mean`` and ``vs_no_verify`` of every record whose anchors have run: the honest
    run of the same task, aggregator, relay checks and replay share; the honest run of mean (plain FedAvg) with
    those; and (wall time per round) the same run at replay share 0."""
    honest = {r.key: r for r in records if r.attack == "none" and r.value is not None}
    unverified = {r.variant: r for r in records if r.verify == 0 and r.wall_round_s}
    for record in records:
        points = tasks[record.task].points
        same, mean = honest.get(record.key), honest.get((record.task, "mean", record.checks, record.verify))
        record.vs_honest = relative(record.value, same.value if same else None, points)
        record.vs_mean = relative(record.value, mean.value if mean else None, points)
        anchor = unverified.get(record.variant)
        record.vs_no_verify = record.wall_round_s / anchor.wall_round_s \
            if anchor is not None and record.wall_round_s is not None else None


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


def share_cell(record: Any) -> str:
    return "-" if record.verify is None else "0 (--no-verify)" if record.verify == 0 else f"{record.verify:g}"


def caught_cell(record: Any) -> str:
    if record.attackers_banned is None:
        return "-"
    return f"{record.attackers_banned}/{len(record.ban_rounds) if record.ban_rounds else record.attackers}"


def ban_rounds_cell(record: Any) -> str:
    """``1, 1, 3`` (rounds counted from 0), ``never`` for an attacker not banned; ``-`` without attackers."""
    return ", ".join("never" if r is None else str(r) for r in record.ban_rounds) or "-"


def honest_banned_cell(record: Any) -> str:
    return "-" if record.honest_banned is None else str(record.honest_banned) + (" **WARNING**"
                                                                                 if record.honest_banned else "")


def warning(record: Any) -> str | None:
    """The loud line for a run that banned honest peers (a verification false positive), else None."""
    if not record.honest_banned:
        return None
    return (f"WARNING: {record.honest_banned} HONEST PEER(S) BANNED in {record.task} {record.aggregator} "
            f"{record.attack} (replay share {share_cell(record)}): {'; '.join(record.honest_ban_reasons)[:400]}")


def print_progress(record: Any) -> None:
    outcome = record.error or (f"{record.metric}={number(record.value, 4)}, {record.rounds}/{record.num_rounds} "
                               f"rounds, refused: {codes(record.refusals)}")
    if not record.error and record.attackers_banned is not None and record.verify is not None:
        outcome += (f", caught {caught_cell(record)} in rounds {ban_rounds_cell(record)}, honest banned "
                    f"{record.honest_banned}, replay wait {number(record.replay_wait_s, 2)} s/round")
    if not record.error and record.lies_merged:
        outcome += f", poisoned results merged before the ban {', '.join(map(str, record.lies_merged))}"
    setup = f"checks {record.checks}" + (f", honest first {record.honest_first}" if record.honest_first else "") \
        + (f", replay share {share_cell(record)}" if record.verify is not None else "")
    print(f"{record.task:8s} {record.aggregator:17s} {record.attack:16s} {record.fraction:4.2f} "
          f"({attackers_cell(record)}; {setup}): {outcome}; {record.seconds:.1f} s", flush=True)
    loud = warning(record)
    if loud:
        print(loud, flush=True)


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


def verify_row(record: Any, points: bool) -> str:
    if record.error:
        return (f"| {share_cell(record)} | {record.attack} | {attackers_cell(record)} | error: "
                f"{record.error[:80].replace('|', '/')} |" + " - |" * (len(VERIFY_COLUMNS) - 4))
    value = "-" if record.value is None else (f"{100 * record.value:.1f}%" if points else f"{record.value:.4f}")
    rounds = f"{record.rounds}/{record.num_rounds}" + (" (stopped)" if record.stopped else "")
    replays = "-" if record.replays is None else str(record.replays)
    failed = record.counters.get("verification_failed", 0)
    share = "as shipped" if record.verify is None else share_cell(record)
    cells = [share, record.attack, attackers_cell(record), value, shown(record.vs_honest, points),
             rounds, caught_cell(record) if record.attackers else "-", ban_rounds_cell(record),
             honest_banned_cell(record), codes(record.refusals), replays + (f" ({failed} failed)" if failed else ""),
             number(record.replay_wait_s, 2), number(record.wall_round_s, 2),
             "-" if record.vs_no_verify is None else f"{record.vs_no_verify:.2f}x", f"{record.seconds:.1f}"]
    return "| " + " | ".join(cells) + " |"


def tables(shown: Sequence[tuple[Any, Sequence[Any]]], tasks: Mapping[str, Any], features: Any) -> str:
    """One Markdown table per section of the grid (the honest runs appear in each section that uses them); a
    section that crosses replay shares has the verification columns (VERIFY_COLUMNS)."""
    out = []
    for section, rows in shown:
        grid = tasks[section.task]
        metric = f"{grid.metric} ({grid.label})"
        verifying = getattr(section, "verify_shares", None) is not None
        columns = VERIFY_COLUMNS if verifying else COLUMNS
        aggregators = ", ".join(dict.fromkeys(aggregator_cell(r) for r in rows)) if verifying else ""
        out.append(f"### {section.task}, {section.title}{' (' + aggregators + ')' if aggregators else ''}: "
                   f"final {metric}")
        out.append("")
        out.append("| " + " | ".join(metric if c == "metric" else c for c in columns) + " |")
        out.append("|" + " --- |" * 3 + " ---: |" * (len(columns) - 3))
        out += [(verify_row if verifying else row)(r, grid.points) for r in rows]
        out.append("")
    once = {id(r): r for _, rows in shown for r in rows}  # a shared run warns once
    loud = [line for line in map(warning, once.values()) if line]
    out += loud + ([""] if loud else [])
    if not getattr(features, "aggregate", False):
        out.append("This relay has no --aggregate: `mean` and `default` are its plain FedAvg.")
    return "\n".join(out).rstrip() + "\n"
