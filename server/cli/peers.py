"""``peertrain peers N --url URL``: N headless Chromium peers on a relay's page (``server.browser.peers``)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "start N headless Chromium peers against a relay"
DESCRIPTION = ("Open the relay's page in N headless Chromium contexts that join and train; show the session's rounds; "
               "exit when the session is done.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("count", type=int, metavar="N", help="how many headless peers to start")
    parser.add_argument("--url", default="http://127.0.0.1:8000/", help="the relay's URL (what `serve` prints)")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="give up after this many seconds (exit 1); default 0: wait until the session is done")
    parser.add_argument("--workers", type=int, default=0, metavar="W",
                        help="training workers per page, each a peer of its own (default 0: the page's own default, "
                        "one fewer than the machine's cores, at least 1)")
    parser.add_argument("--headful", action="store_true", help="show the browser windows")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between looks at the relay and the pages")
    parser.add_argument("--local-data", action="append", type=Path, default=[], metavar="DIR",
                        help="local tasks: each peer's own files, one folder per peer (repeatable), or one folder "
                        "holding a sub-folder per peer; given through the page's file chooser, they stay in the "
                        "browser")


def run(args: argparse.Namespace) -> int:
    from server.browser.peers import run_peers

    return run_peers(args.count, args.url, timeout_s=args.timeout, headless=not args.headful, poll_s=args.poll,
                     local_data=args.local_data, workers=args.workers)
