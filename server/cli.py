"""``peertrain``: the command line.

Each command lives in its own module and registers itself here; a command that is not built
yet says so plainly and exits with status 2 instead of pretending.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]

NOT_BUILT = {
    "peers": ("start N headless Chromium peers against a relay", "issue 6 (relay and browser peers)"),
    "simulate": ("run a training session in-process, without browsers", "issue 5 (rounds and merges)"),
    "bench": ("run the benchmarks (runtime, tasks, merges, relay, webgpu)", "issues 3-7"),
}


def add_serve(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="start the relay and the page; prints the URL to join",
                                   description="Start the relay: it serves the page, Pyodide and the wheels.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from server.serve import serve

    return serve(host=args.host, port=args.port, log_level=args.log_level)


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


def add_not_built(subparsers: argparse._SubParsersAction, name: str, summary: str, where: str) -> None:
    parser = subparsers.add_parser(name, help=f"{summary} [not built yet]", description=f"{summary}. Not built yet.")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def handler(args: argparse.Namespace) -> int:
        print(f"peertrain {name}: not built yet; it arrives with {where}.", file=sys.stderr)
        return 2

    parser.set_defaults(handler=handler)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="peertrain", description="Distributed training across browser peers.")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    add_serve(subparsers)
    add_package(subparsers)
    for name, (summary, where) in NOT_BUILT.items():
        add_not_built(subparsers, name, summary, where)
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
