"""The ``peertrain`` command line: ``server.cli.commands`` builds the parser from one module per command."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from server.cli.options import single_threaded_blas, wants_one_blas_thread


def main(argv: Sequence[str] | None = None) -> int:
    """The ``peertrain`` entry point: one BLAS thread for the commands that want it, then ``server.cli.commands``."""
    words = list(sys.argv[1:] if argv is None else argv)
    if wants_one_blas_thread(words):
        single_threaded_blas()
    from server.cli.commands import main as run

    return run(words)
