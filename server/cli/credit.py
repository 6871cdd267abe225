"""``peertrain credit SESSION_DIR``: what each volunteer gave a session, as the relay counts it
(``server.relay.credit``)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

HELP = "the credit each volunteer earned in a session (CSV or JSON)"
DESCRIPTION = ("Credit for verified work, read from a session's folder and its store as the relay counts it: GFLOP of "
               "training per unit whose verification settled, per volunteer (a key its page proved; a peer without "
               "one counts on its own), with the recent average (credit a day, half-life 7 days), units and rank.")
COLUMNS = ("rank", "volunteer", "name", "team", "total", "recent_average", "units")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session_dir", type=Path, metavar="SESSION_DIR", help="the session's folder (serve's)")
    parser.add_argument("--store", default=None, metavar="URL",
                        help="the session's store when it is not relay.sqlite3 in the folder (postgresql://...)")
    parser.add_argument("--format", choices=("csv", "json"), default="csv", help="CSV (a row per volunteer) or JSON "
                        "(the volunteers and the teams, as GET /api/credit answers)")
    parser.add_argument("--teams", action="store_true", help="CSV: a row per team instead of per volunteer")


def run(args: argparse.Namespace) -> int:
    from server.relay.context import RelayContext
    from server.relay.credit import Credit
    from server.relay.options import RelayOptions
    from server.relay.store import StoreUnavailable, open_store
    from server.session.checkpoint_files import CheckpointError
    from server.session.session import Session

    location = args.store or args.session_dir / "relay.sqlite3"
    if args.store is None and not Path(location).is_file():
        print(f"peertrain credit: {args.session_dir} holds no relay.sqlite3 (a session served elsewhere: --store)",
              file=sys.stderr)
        return 2
    try:
        session = Session.restore(args.session_dir)
        store = open_store(location)
    except (CheckpointError, StoreUnavailable, FileNotFoundError, ValueError) as error:
        print(f"peertrain credit: {error}", file=sys.stderr)
        return 2
    try:
        package = session.package
        table = Credit(RelayContext(session, package, store, RelayOptions(admin_token=""))).table(fresh=True)  # type: ignore[arg-type]
    finally:
        store.close()
    if args.format == "json":
        json.dump(table, sys.stdout, indent=1)
        print()
        return 0
    columns = ("rank", "team", "total", "recent_average", "units", "volunteers") if args.teams else COLUMNS
    writer = csv.writer(sys.stdout)
    writer.writerow(columns)
    for row in table["teams"] if args.teams else table["volunteers"]:
        writer.writerow([f"{row[c]:.6g}" if isinstance(row[c], float) else row[c] for c in columns])
    return 0
