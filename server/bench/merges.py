"""``peertrain bench merges``: FedAvg vs FedAvgM vs FedAdam on a 2.3 MB byte-level transformer.

The claim under test: with 5 of 55 chunks per round, tuned server momentum or server Adam reach FedAvg's
quality in about two thirds of the rounds and end up to 38% lower.

The byte-level text task (bytelm-2.3mb, 55 chunks of the built-in corpus), 5 participants per round,
3 passes (33 rounds); every setting starts from the same initial weights and sees the same chunk
order. Anchor: FedAvg in the same run. For each setting the table gives the final validation loss,
its ratio to FedAvg's, and the first round after which the loss was at or below FedAvg's loss after
31 rounds (the claim: the best settings got there in 20 rounds, up to 38% lower after 33).
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from server.bench.merge_study import add_study_arguments, run_study
from server.cli.options import add_sweep_options, sweep_settings
from server.session.config import SessionConfig
from server.simulation.simulator import MergeChoice, compare, fmt

SETTINGS = [
    MergeChoice("fedavg"),
    MergeChoice("fedavgm", {"server_momentum": 0.9, "server_learning_rate": 1.0}),
    MergeChoice("fedavgm", {"server_momentum": 0.5, "server_learning_rate": 1.0}),
    MergeChoice("fedavgm", {"server_momentum": 0.9, "server_learning_rate": 0.5}),
    MergeChoice("fedadam", {"eta": 0.003, "tau": 1e-3}),
    MergeChoice("fedadam", {"eta": 0.01, "tau": 1e-3}),
    MergeChoice("fedadam", {"eta": 0.03, "tau": 1e-3}),
]
TARGET_ROUND = 31  # FedAvg's loss after this many rounds is the bar the others must reach
BUDGET_SECONDS = 30 * 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("runs/bench/merges"), help="output folder")
    parser.add_argument("--steps", type=int, default=8, help="local Adam steps per unit (task default 8)")
    parser.add_argument("--validation-windows", type=int, default=256, help="validation windows of 64 bytes")
    parser.add_argument("--rounds", type=int, help="stop each session after this many rounds (quick look)")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and chunk order")
    parser.add_argument("--copy-plot", type=Path, help="also copy the plot here (e.g. docs/bench/merges.png)")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    add_study_arguments(parser)
    add_sweep_options(parser)


def first_round_reaching(series: Sequence[float | None], target: float) -> int | None:
    """The first r >= 1 with series[r] <= target (series[r]: the loss after r rounds), or None."""
    for rounds_done, value in enumerate(series[1:], start=1):
        if value is not None and value <= target:
            return rounds_done
    return None


def results_table(series: dict[str, list[float | None]], target_round: int) -> tuple[str, int]:
    """The Markdown table, anchored on the first entry (FedAvg); returns (table, the target round used)."""
    anchor_label = next(iter(series))
    anchor = series[anchor_label]
    target_round = min(target_round, len(anchor) - 1)
    target = anchor[target_round]
    anchor_final = anchor[-1]
    lines = [f"| setting | final val_loss | vs {anchor_label} | first round at {anchor_label}'s round-{target_round} "
             f"loss ({fmt(target)}) |", "| --- | ---: | ---: | ---: |"]
    for label, values in series.items():
        final = values[-1]
        ratio = "-"
        if final is not None and anchor_final:
            ratio = f"{final / anchor_final:.3f} ({final / anchor_final - 1:+.1%})"
        reached = first_round_reaching(values, target) if target is not None else None
        lines.append(f"| {label} | {fmt(final)} | {ratio} | {reached if reached is not None else 'never'} |")
    return "\n".join(lines), target_round


def run(args: argparse.Namespace) -> int:
    from runtime.planner import RoundPlan
    from server.session.package import build_package

    if args.study:
        return run_study(args, sweep_settings(args))

    started = time.perf_counter()
    out: Path = args.out
    settings = {"chunks": 55, "steps": args.steps, "validation_windows": args.validation_windows}
    package = build_package("bytetext", settings, out / "package", seed=args.seed)
    # The server optimizers over the plain weighted mean (mean): the claim under test compares them, not aggregators;
    # on float32 results.
    config = SessionConfig(participants=5, passes=3, seed=args.seed, max_rounds=args.rounds, aggregate="mean",
                           codec="none")
    plan = RoundPlan(package.data.num_units, config.participants, config.passes, config.seed)
    rounds = plan.num_rounds if args.rounds is None else min(args.rounds, plan.num_rounds)

    # Measure one unit and one validation first, and say how long the whole run should take.
    task, data = package.task, package.data
    unit = plan.units_for_round(0)[0]
    clock = time.perf_counter()
    task.train_unit(package.initial_weights, task.work_unit(data, unit.unit_index, unit.unit_seed))
    unit_seconds = time.perf_counter() - clock
    clock = time.perf_counter()
    task.validate(package.initial_weights, data.validation)
    validate_seconds = time.perf_counter() - clock
    estimate = len(SETTINGS) * rounds * (config.participants * unit_seconds + validate_seconds)
    print(f"one unit ({args.steps} steps): {unit_seconds:.2f} s; one validation: {validate_seconds:.2f} s; "
          f"{len(SETTINGS)} settings x {rounds} rounds: about {estimate / 60:.1f} min")
    if estimate > BUDGET_SECONDS:
        print(f"warning: the estimate exceeds the {BUDGET_SECONDS // 60}-minute budget; lower --steps or "
              "--validation-windows")

    comparison = compare(package, SETTINGS, config, out=out, progress=args.progress, log=lambda _: None,
                         title=f"bytelm-2.3mb, 55 chunks, k=5, {args.steps} local steps: validation loss per round")
    series = {s.config.name: s.metric_series() for s in comparison.sessions}
    table, target_round = results_table(series, TARGET_ROUND)
    total = time.perf_counter() - started
    command = (f"peertrain bench merges --steps {args.steps} --validation-windows {args.validation_windows} "
               f"--seed {args.seed}" + (f" --rounds {args.rounds}" if args.rounds else ""))
    report = (f"{table}\n\nCommand: `{command}`. {len(SETTINGS)} settings x {rounds} rounds x 5 units; "
              f"total {total / 60:.1f} min (estimate was {estimate / 60:.1f} min). Plot: {comparison.plot}\n")
    (out / "merges.md").write_text(report)
    if args.copy_plot is not None:
        args.copy_plot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(comparison.plot, args.copy_plot)
    print(report)
    best = min((v[-1] for v in series.values() if v[-1] is not None and math.isfinite(v[-1])), default=None)
    print(f"best final val_loss {fmt(best)}; target round {target_round}; total time {total:.0f} s")
    return 0
