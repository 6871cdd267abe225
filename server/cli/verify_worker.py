"""``peertrain verify-worker --store URL``: a verification worker, replaying what a relay started with
``--remote-replays`` queues in its store (``server.relay.remote_replays``)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

HELP = "replay units for a relay started with --remote-replays, from its store"
DESCRIPTION = ("Claim the replays a relay (serve --remote-replays) queues in its store, replay each on the engine "
               "the relay names and send the result back; start as many as the replays need, on any machine that "
               "reaches the store. A worker that dies leaves its claim to run out; another takes the replay.")
IDLE_POLL_SECONDS = 0.2  # how often an idle worker asks the store for a replay


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, metavar="URL",
                        help="the relay's store: its --store URL (postgresql://...), or its SQLite file on this "
                        "machine (the session folder's relay.sqlite3)")
    parser.add_argument("--claim-seconds", type=float, default=120.0, metavar="S",
                        help="how long a claimed replay is this worker's; past it, another worker may take it (make "
                        "it longer than a replay takes; default 120)")
    parser.add_argument("--max-replays", type=int, default=0, metavar="N",
                        help="exit after N replays (default 0: run until stopped)")
    parser.add_argument("--idle-exit", type=float, default=0.0, metavar="S",
                        help="exit after S seconds with nothing to replay (default 0: wait for more)")
    parser.add_argument("--name", default="", help="this worker's name in the store (default: host and process)")


def run(args: argparse.Namespace) -> int:
    from runtime.protocol import Job
    from runtime.tasks.base import TaskError
    from runtime.tasks.loader import task_class
    from server.browser_assets.engines import Engine, EngineError, make_engine
    from server.relay.store import StoreUnavailable, UnsupportedStore, open_store
    from server.relay.store.records import FinishedReplay

    if args.claim_seconds <= 0 or args.max_replays < 0 or args.idle_exit < 0:
        print("peertrain verify-worker: --claim-seconds must be above 0, --max-replays and --idle-exit at least 0",
              file=sys.stderr)
        return 2
    try:
        store = open_store(args.store)
    except (StoreUnavailable, UnsupportedStore) as error:
        print(f"peertrain verify-worker: {error}", file=sys.stderr)
        return 2
    name = args.name or f"{socket.gethostname()}:{os.getpid()}"
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    engines: dict[str, Engine] = {}
    tasks: dict[str, dict] = {}
    weights: dict[str, bytes] = {}  # (the last round's: replays of one round share them)
    done, idle_since = 0, time.monotonic()
    print(f"verify-worker {name}: waiting for replays", flush=True)
    try:
        while not stopping.is_set() and (args.max_replays == 0 or done < args.max_replays):
            claimed = store.claim_replay_job(name, args.claim_seconds)
            if claimed is None:
                if args.idle_exit and time.monotonic() - idle_since > args.idle_exit:
                    break
                stopping.wait(IDLE_POLL_SECONDS)
                continue
            started = time.perf_counter()
            job = Job.from_json(json.loads(claimed.job))
            try:
                if claimed.task not in tasks:
                    tasks[claimed.task] = task_info = json.loads(store.blob(claimed.task) or b"{}")
                    source = task_info.get("task_source")
                    if source and Path(source).is_file():  # a task from a file: import it as the relay named it
                        task_class(source)
                if claimed.weights not in weights:
                    weights.clear()
                    weights[claimed.weights] = store.blob(claimed.weights) or b""
                if claimed.engine not in engines:
                    engines[claimed.engine] = make_engine(claimed.engine)
                engine = engines[claimed.engine]
                message = engine.train(tasks[claimed.task], job, weights[claimed.weights], claimed.unit or None)
                result = FinishedReplay(message, "", time.perf_counter() - started, engine.name)
            except (EngineError, TaskError, ValueError, KeyError) as error:  # (its trouble: said, no verdict)
                result = FinishedReplay(b"", f"{type(error).__name__}: {error}", time.perf_counter() - started,
                                        claimed.engine)
            kept = store.finish_replay_job(claimed.id, name, result)
            done += 1
            idle_since = time.monotonic()
            print(f"verify-worker {name}: round {job.round} slot {job.slot} replayed in {result.seconds:.2f} s"
                  + (f" (failed: {result.error})" if result.error else "")
                  + ("" if kept else " (too late: another worker took it)"), flush=True)
    finally:
        for engine in engines.values():
            engine.close()
        store.close()
    print(f"verify-worker {name}: {done} replays", flush=True)
    return 0
