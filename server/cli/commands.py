"""``peertrain``: the command line. One module per command in this package, each with ``HELP``,
``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args) -> int`` (the exit status)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import ModuleType

from server.cli import bench, credit, export, package, peers, serve, simulate, verify_worker

COMMANDS: dict[str, ModuleType] = {"serve": serve, "peers": peers, "package": package, "simulate": simulate,
                                   "export": export, "credit": credit, "bench": bench, "verify-worker": verify_worker}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="peertrain", description="Distributed training across browser peers.")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(name, help=command.HELP, description=command.DESCRIPTION,
                                    epilog=getattr(command, "EPILOG", None))
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
