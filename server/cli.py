"""``peertrain``: the command line.

Each command lives in its own module and registers itself here. ``bench`` dispatches to
``server.bench``; a benchmark whose module does not exist says "not built yet" and exits with 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]

def add_serve(subparsers: argparse._SubParsersAction) -> None:
    from server.serve import add_arguments

    parser = subparsers.add_parser("serve", help="start the relay and the page; prints the URL to join",
                                   description="Start (or resume) a session and the relay that serves the page, "
                                   "Pyodide and the wheels, hands out work and merges results.")
    add_arguments(parser)
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from server.serve import serve

    return serve(args)


def add_peers(subparsers: argparse._SubParsersAction) -> None:
    from server.peers import add_arguments

    parser = subparsers.add_parser("peers", help="start N headless Chromium peers against a relay",
                                   description="Open the relay's page in N headless Chromium contexts that join "
                                   "and train; show the session's rounds; exit when the session is done.")
    add_arguments(parser)
    parser.set_defaults(handler=run_peers)


def run_peers(args: argparse.Namespace) -> int:
    from server.peers import main_from_args

    return main_from_args(args)


def parse_sets(pairs: Sequence[str]) -> dict[str, object]:
    """``--set key=value`` pairs; values are read as JSON when they parse (numbers, lists), else as text."""
    settings: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        try:
            settings[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            settings[key.strip()] = raw
    return settings


def add_task_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that builds a task: which task, its settings, the seed."""
    parser.add_argument("--task", default="arith",
                        help="built-in task (bytetext, arith, cartpole), a file path.py, or package.module[:Class]")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a task setting, repeatable (e.g. --set tokenizer=char --set chunks=5)")
    parser.add_argument("--seed", type=int, default=0, help="seed for initial weights and the unit order")


def add_package(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("package", help="build a task package (chunks, validation split, initial weights)",
                                   description="Build a task package into a folder; --inspect shows how the "
                                   "task's tokenizer cuts a few examples.")
    add_task_options(parser)
    parser.add_argument("--out", type=Path, default=Path("runs/package"), help="output folder")
    parser.add_argument("--inspect", action="store_true", help="print how the tokenizer cuts a few examples")
    parser.set_defaults(handler=run_package)


def run_package(args: argparse.Namespace) -> int:
    from runtime.tasks import TaskError
    from server.package import build_package

    try:
        package = build_package(args.task, parse_sets(args.sets), args.out, seed=args.seed)
    except TaskError as error:
        print(f"peertrain package: {error}", file=sys.stderr)
        return 2
    if args.inspect:
        inspect = getattr(package.task, "inspect_lines", None)
        if inspect is None:
            print(f"task {package.task.name} has no tokenizer to inspect")
        else:
            for line in inspect():
                print(line)
    return 0


def add_simulate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate", help="run training sessions in-process, without browsers; compare merge methods",
        description="Run sessions in-process with the same runtime code a browser runs. Several --merge choices "
        "run from the same initial weights and chunk order and are compared in one plot and one table.")
    add_task_options(parser)
    parser.add_argument("--package", type=Path, help="a built package folder (instead of --task/--set)")
    parser.add_argument("--merge", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                        help="fedavg, fedavgm or fedadam; repeatable or a comma list; settings per choice, e.g. "
                        "fedavgm:server_momentum=0.5 (default fedavg)")
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
    parser.set_defaults(handler=run_simulate)


def single_threaded_blas() -> None:
    """One BLAS thread for in-process training, unless the user chose otherwise.

    The simulator trains many small units one after another (as a browser does, single-threaded); on a
    busy 2-core host, OpenBLAS's spinning worker threads made a unit 10-15x slower, for the same bits.
    It only takes effect before numpy is first imported, which is the case when run from the command line.
    """
    if "numpy" not in sys.modules:
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            os.environ.setdefault(name, "1")


def run_simulate(args: argparse.Namespace) -> int:
    single_threaded_blas()
    from server.simulate import run_from_args

    return run_from_args(args)


def add_bench(subparsers: argparse._SubParsersAction) -> None:
    from server.bench import BENCHES, summary

    parser = subparsers.add_parser("bench", help="run the benchmarks (runtime, tasks, merges, relay, webgpu)",
                                   description="Run a benchmark; `peertrain bench NAME --help` lists its options.",
                                   epilog="benches:\n" + summary(), formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("name", choices=list(BENCHES), metavar="NAME", help=", ".join(BENCHES))
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from server.bench import run_bench as dispatch

    if args.name == "merges":
        single_threaded_blas()
    return dispatch(args.name, args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="peertrain", description="Distributed training across browser peers.")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    add_serve(subparsers)
    add_peers(subparsers)
    add_package(subparsers)
    add_simulate(subparsers)
    add_bench(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
