"""``peertrain bench disk``: the relay's disk over a long session, pruning merged rounds' messages or keeping all.

A real ``peertrain serve`` runs the majority example for 50 rounds (k = 2 of 4 units, 25 passes) with native
peers (``server.bench.chaos_relay``); after every round the bench reads the relay's own disk report
(``/api/session`` ``storage``: the SQLite file with its write-ahead log, and the rest of the session folder).
Twice in the same bench: with the default ``--keep-results`` (the figure) and with ``--keep-results all``
(the anchor: every result message kept, as before pruning). Flat means: after the first rounds the SQLite
file grows by under 2% of what keeping every message adds per round (bookkeeping rows only), and the folder
by the history's one line per round only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from server.bench.chaos_relay import EXAMPLES, Uploads, chaos_relay, retrying_peer
from server.harness.serve_command import ServeCommand
from server.relay.options import DEFAULT_KEEP_RESULTS, RelayOptions
from server.session.config import SessionConfig
from server.session.settings import declared, text_reader

ADMIN = "disk-admin"


def serve_command(session_dir: Path, *, passes: int, hidden: int, keep: str) -> ServeCommand:
    """The majority example, 2 of its 4 units a round; ``keep``: ``--keep-results`` as typed (a number, or all)."""
    keep_results = text_reader(declared(RelayOptions)["keep_results"])(keep)
    return ServeCommand(task="majority_task:MajorityTask", session_dir=session_dir,
                        task_settings={"chunks": 4, "examples": 1024, "epochs": 1, "hidden": hidden},
                        config=SessionConfig(participants=2, passes=passes, on_divergence="rollback"),
                        options=RelayOptions(admin_token=ADMIN, keep_results=keep_results))


def measure(work: Path, *, keep: str, passes: int, hidden: int, peers: int = 2, timeout_s: float = 600,
            log: Any = print) -> list[dict[str, Any]]:
    """The relay's storage report after each round of one session."""
    work.mkdir(parents=True, exist_ok=True)
    relay = chaos_relay(serve_command(work / "session", passes=passes, hidden=hidden, keep=keep), work / "serve.log")
    uploads, stop = Uploads(), threading.Event()
    relay.start()
    deadline = time.monotonic() + timeout_s
    threads = [retrying_peer(relay.url, uploads, stop, deadline) for _ in range(peers)]
    for thread in threads:
        thread.start()
    rows: list[dict[str, Any]] = []
    seen = -1
    try:
        with httpx.Client(base_url=relay.url, timeout=10) as client:
            while time.monotonic() < deadline:
                status = client.get("/api/session").json()
                if status["round"] > seen and not status["merging"]:
                    seen = status["round"]
                    rows.append({"round": seen, **status["storage"]})
                    if seen % 10 == 0:
                        log(f"  keep {keep}: round {seen}/{status['num_rounds']}, SQLite "
                            f"{status['storage']['sqlite_bytes'] / 1e6:.2f} MB, session folder "
                            f"{status['storage']['checkpoint_bytes'] / 1e6:.2f} MB")
                if status["done"]:
                    break
                time.sleep(0.02)
            else:
                raise TimeoutError(f"the session did not finish in {timeout_s:.0f} s; see {relay.log}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        relay.stop()
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--passes", type=int, default=25, help="passes over the 4 units, 2 a round (default 25: "
                        "50 rounds)")
    parser.add_argument("--hidden", type=int, default=8192, help="the model's width (default 8192: 90k weights, "
                        "a 0.36 MB result message)")
    parser.add_argument("--keep", default=str(DEFAULT_KEEP_RESULTS), help="--keep-results of the measured run "
                        f"(default {DEFAULT_KEEP_RESULTS}, serve's default)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/disk.json"), help="figures as JSON")


def growth(rows: list[dict[str, Any]], key: str, after: int) -> float:
    """Bytes per round of ``key`` from round ``after`` to the last round."""
    later = [row for row in rows if row["round"] >= after]
    if len(later) < 2:
        return 0.0
    return (later[-1][key] - later[0][key]) / (later[-1]["round"] - later[0]["round"])


def run(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(EXAMPLES))
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="peertrain-disk-") as temporary:
        for keep in (args.keep, "all"):
            print(f"a {args.passes * 2}-round session with --keep-results {keep} ...", flush=True)
            figures[keep] = measure(Path(temporary) / f"keep-{keep}", keep=keep, passes=args.passes,
                                    hidden=args.hidden, log=lambda line: print(line, flush=True))
    pruned, kept = figures[args.keep], figures["all"]
    after = 20  # (the folder steps up once while the best checkpoint and the two kept rounds fill in)
    print(f"{'':24s} {'--keep-results ' + args.keep:>20s} {'--keep-results all':>20s}")
    for label, key in (("SQLite file, MB", "sqlite_bytes"), ("session folder, MB", "checkpoint_bytes")):
        for name, index in ((f"after round {after}", after), ("at the end", -1)):
            print(f"{label + ' ' + name:40s} {pruned[index][key] / 1e6:10.2f} {kept[index][key] / 1e6:20.2f}")
    for label, key in (("SQLite growth per round, kB", "sqlite_bytes"),
                       ("folder growth per round, kB", "checkpoint_bytes")):
        print(f"{label + f' (rounds {after}-{pruned[-1]['round']})':40s} {growth(pruned, key, after) / 1e3:10.2f} "
              f"{growth(kept, key, after) / 1e3:20.2f}")
    # Flat: the SQLite file grows by under 2% of what keeping every message adds per round (a few bookkeeping
    # rows: peers, counters), the folder by under 3 kB per round (the history's line).
    share = growth(pruned, "sqlite_bytes", after) / max(1.0, growth(kept, "sqlite_bytes", after))
    flat = share < 0.02 and growth(pruned, "checkpoint_bytes", after) < 3000
    ratio = pruned[-1]["sqlite_bytes"] / max(1, kept[-1]["sqlite_bytes"])
    print(f"SQLite at the end: {ratio:.3f} of keeping every message; its growth per round after round {after}: "
          f"{share:.4f} of keeping every message; flat: {flat}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"passes": args.passes, "hidden": args.hidden, "rounds": figures}, indent=1))
    print(f"figures written to {args.out}")
    return 0 if flat else 1
