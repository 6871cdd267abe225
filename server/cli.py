"""``peertrain``: the command line.

Each command lives in its own module and registers itself here; a command that is not built
yet says so plainly and exits with status 2 instead of pretending.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]

NOT_BUILT = {
    "peers": ("start N headless Chromium peers against a relay", "issue 6 (relay and browser peers)"),
    "simulate": ("run a training session in-process, without browsers", "issue 5 (rounds and merges)"),
    "package": ("build a task package (chunks, validation split, initial weights)", "issue 4 (tasks)"),
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
