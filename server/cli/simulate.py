"""``peertrain simulate``: whole sessions in-process with the same runtime code a browser runs; compares merges."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from server.cli.options import add_aggregate_options, add_task_options, merge_names, parse_sets

HELP = "run training sessions in-process, without browsers; compare merge methods"
DESCRIPTION = ("Run sessions in-process with the same runtime code a browser runs. Several --merge choices run from "
               "the same initial weights and chunk order and are compared in one plot and one table.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_task_options(parser)
    parser.add_argument("--package", type=Path, help="a built package folder (instead of --task/--set)")
    parser.add_argument("--merge", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                        help=f"{', '.join(merge_names())}; repeatable or a comma list; settings per choice, e.g. "
                        "fedavgm:server_momentum=0.5 (default fedavg)")
    add_aggregate_options(parser)
    group = parser.add_argument_group("merge hyperparameters (applied to every chosen method that takes them)")
    group.add_argument("--server-lr", dest="server_learning_rate", type=float, help="FedAvgM server learning rate")
    group.add_argument("--server-momentum", type=float, help="FedAvgM server momentum")
    group.add_argument("--nesterov", action="store_const", const=True, help="FedAvgM: Nesterov momentum")
    group.add_argument("--eta", type=float, help="FedAdam step size")
    group.add_argument("--beta1", dest="beta_1", type=float, help="FedAdam first-moment decay")
    group.add_argument("--beta2", dest="beta_2", type=float, help="FedAdam second-moment decay")
    group.add_argument("--tau", type=float, help="FedAdam adaptivity (denominator offset)")
    group.add_argument("--no-bias-correction", dest="bias_correction", action="store_const", const=False,
                       help="FedAdam without bias correction (the paper's Algorithm 2)")
    parser.add_argument("-k", "--participants", type=int, help="assignments per round (default min(5, units))")
    parser.add_argument("--passes", type=int, default=3, help="passes over the units (default 3)")
    parser.add_argument("--rounds", type=int, help="stop after this many rounds (default: all planned rounds)")
    parser.add_argument("--force", action="store_true", help="run FedAvgM/FedAdam even where the guard refuses")
    parser.add_argument("--on-divergence", choices=["stop", "rollback"], default="stop",
                        help="on a non-finite or exploding validation metric: stop, or restore the best weights")
    parser.add_argument("--divergence-factor", type=float, default=3.0,
                        help="a loss above this many times the best so far counts as divergence (default 3)")
    parser.add_argument("--out", type=Path, default=Path("runs/simulate"), help="output folder")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


MERGE_OPTIONS = ("server_learning_rate", "server_momentum", "nesterov", "eta", "beta_1", "beta_2", "tau",
                 "bias_correction")


def run(args: argparse.Namespace) -> int:
    """``peertrain simulate``: build (or load) the package, run the comparison, report. 2 on a refused set-up."""
    from runtime.merge import MergeError
    from runtime.planner import PlanError
    from runtime.tasks import TaskError
    from server.session.config import SessionError
    from server.session.package import Package, build_package
    from server.session.simulator import compare, parse_merge_choices, with_common_settings

    def fail(error: Exception) -> int:
        print(f"peertrain simulate: {error}", file=sys.stderr)
        return 2

    try:
        common = {name: getattr(args, name) for name in MERGE_OPTIONS if getattr(args, name, None) is not None}
        choices = with_common_settings(parse_merge_choices(args.merge), common)
        if args.package is not None:
            package = Package.load(args.package)
        else:
            package = build_package(args.task, parse_sets(args.sets), Path(args.out) / "package", seed=args.seed)
        participants = args.participants or min(5, package.data.num_units)
        comparison = compare(package, choices, out=args.out, participants=participants, passes=args.passes,
                             seed=args.seed, max_rounds=args.rounds, force=args.force,
                             on_divergence=args.on_divergence, divergence_factor=args.divergence_factor,
                             progress=args.progress, aggregate=args.aggregate, aggregate_config=args.aggregate_config)
    except (MergeError, PlanError, TaskError, SessionError, FileNotFoundError) as error:
        return fail(error)
    stopped = [s for s in comparison.sessions if s.stopped]
    for session in stopped:
        print(f"{session.config.name}: stopped: {session.stopped}", file=sys.stderr)
    return 0
