"""``peertrain package``: build a task package (chunks, validation split, initial weights, tokenizer)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from server.cli.options import add_task_options, parse_sets

HELP = "build a task package (chunks, validation split, initial weights)"
DESCRIPTION = "Build a task package into a folder; --inspect shows how the task's tokenizer cuts a few examples."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_task_options(parser)
    parser.add_argument("--out", type=Path, default=Path("runs/package"), help="output folder")
    parser.add_argument("--inspect", action="store_true", help="print how the tokenizer cuts a few examples")


def run(args: argparse.Namespace) -> int:
    from runtime.tasks import TaskError
    from server.session.package import build_package

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
