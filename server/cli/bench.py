"""``peertrain bench NAME``: the benchmarks (``server.bench``); each prints its figure beside its anchor."""

from __future__ import annotations

import argparse

from server.bench import BENCHES, summary

HELP = "run the benchmarks (" + ", ".join(BENCHES) + ")"
DESCRIPTION = "Run a benchmark; `peertrain bench NAME --help` lists its options."
EPILOG = "benches:\n" + summary()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawTextHelpFormatter
    parser.add_argument("name", choices=list(BENCHES), metavar="NAME", help=", ".join(BENCHES))
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from server.bench import run_bench

    return run_bench(args.name, args.bench_args)
