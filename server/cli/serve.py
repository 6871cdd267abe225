"""``peertrain serve``: build or resume a session, bind, print the URL to join, run the relay under uvicorn."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import uvicorn

from server.cli.options import add_aggregate_options, add_task_options, merge_names, parse_sets
from server.paths import REPO_ROOT
from server.relay.app import RelayPaths, create_app
from server.relay.limits import add_limit_options, limits_from_args, raise_file_limit
from server.relay.options import (
    DEFAULT_BACKUP_AFTER,
    DEFAULT_JOIN_BURST,
    DEFAULT_JOIN_RATE,
    DEFAULT_KEEP_RESULTS,
    DEFAULT_MAX_PEERS_PER_ADDRESS,
    DEFAULT_OUTLIER_FACTOR,
)
from server.relay.verify import DEFAULT_VERIFY_ATOL, DEFAULT_VERIFY_FRACTION, DEFAULT_VERIFY_RTOL
from server.session.config import DIVERGENCE_ACTIONS

HELP = "start the relay and the page; prints the URL to join"
DESCRIPTION = ("Start (or resume) a session and the relay that serves the page, Pyodide and the wheels, hands out "
               "work and merges results.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    add_task_options(parser)
    parser.add_argument("--package", type=Path, help="a package built with `peertrain package` (else built here)")
    parser.add_argument("--session-dir", type=Path, help="where checkpoints and the SQLite file live "
                        "(default: runs/session-<task> under $PEERTRAIN_HOME, else under the working directory); "
                        "an existing session there is resumed")
    parser.add_argument("--public-model", action="store_true",
                        help="anyone may download the model (GET /api/model, the page's Download link); "
                        "default: only with the admin token")
    parser.add_argument("--keep-results", type=keep_results_value, default=DEFAULT_KEEP_RESULTS, metavar="N",
                        help="merged rounds whose result messages stay in SQLite, for audits and replays of recent "
                        f"rounds (default {DEFAULT_KEEP_RESULTS}; 'all' keeps every one); older rounds keep one audit "
                        "row per result (peer, unit, examples, metrics, sha256, verification), so the disk stays "
                        "flat. The open round's messages are always kept (its merge, a restart, a dispute need them)")
    parser.add_argument("--fresh", action="store_true", help="discard an existing session in --session-dir")
    parser.add_argument("--merge", default="fedavg", choices=merge_names(), help="the merge method (default fedavg)")
    parser.add_argument("--merge-config", default="{}", help='merge hyperparameters as JSON, e.g. {"eta": 0.01}')
    add_aggregate_options(parser)
    parser.add_argument("-k", "--participants", type=int, default=3, help="assignments per round")
    parser.add_argument("--passes", type=int, default=3, help="passes over the work units")
    parser.add_argument("--force", action="store_true", help="run a stateful merge where the guard refuses it")
    parser.add_argument("--on-divergence", choices=DIVERGENCE_ACTIONS, default="stop",
                        help="on a non-finite or exploding validation metric: stop, or restore the best weights")
    parser.add_argument("--lease-seconds", type=float, default=120.0, help="time a peer has for one unit")
    parser.add_argument("--peer-timeout", type=float, default=30.0, help="silence after which a peer is gone")
    parser.add_argument("--min-peers", type=int, help="peers needed before a round starts (default k)")
    parser.add_argument("--max-update-norm", type=float, default=1e4, help="refuse results that move further")
    guard = parser.add_argument_group("an open session's guards (anyone with the URL can join)")
    guard.add_argument("--outlier-factor", type=float, default=DEFAULT_OUTLIER_FACTOR,
                       help="refuse an update more than this many times the median norm of the round's accepted "
                       f"updates (default {DEFAULT_OUTLIER_FACTOR:g}; 0: off)")
    guard.add_argument("--join-rate", type=float, default=DEFAULT_JOIN_RATE,
                       help=f"joins per second per client address after a burst (default {DEFAULT_JOIN_RATE:g}; "
                       "0: no limit); over it a join gets 429 with Retry-After")
    guard.add_argument("--join-burst", type=int, default=DEFAULT_JOIN_BURST,
                       help=f"joins one address may make at once (default {DEFAULT_JOIN_BURST})")
    guard.add_argument("--max-peers-per-address", type=int, default=DEFAULT_MAX_PEERS_PER_ADDRESS,
                       help=f"live peers one client address may hold (default {DEFAULT_MAX_PEERS_PER_ADDRESS}; "
                       "0: any)")
    guard.add_argument("--verify-fraction", type=float, default=DEFAULT_VERIFY_FRACTION,
                       help="share of results the host re-trains and compares, besides every peer's first result "
                       f"and the outliers (default {DEFAULT_VERIFY_FRACTION:g}; 1: all)")
    guard.add_argument("--verify-rtol", type=float, default=None,
                       help="replay tolerance: |result - replay| <= rtol * |replay - global| + atol (default: the "
                       f"task's, else {DEFAULT_VERIFY_RTOL:g})")
    guard.add_argument("--verify-atol", type=float, default=DEFAULT_VERIFY_ATOL, help=argparse.SUPPRESS)
    guard.add_argument("--no-verify", dest="verify", action="store_false",
                       help="no host replays (and so no bans for a failed one)")
    guard.add_argument("--force-verify", action="store_true",
                       help="replay even a task that declares its browser and native units can part ways (only "
                       "for sessions whose peers all run natively, e.g. the benches)")
    guard.add_argument("--redundancy", type=float, default=0.0, metavar="F",
                       help="share of units also trained by a second, different peer and compared with the first "
                       "result (identical from one engine; a disagreement is decided by a host replay, or the "
                       "unit goes to a third peer); never both merged (default 0: off)")
    parser.add_argument("--backup-after", type=float, default=DEFAULT_BACKUP_AFTER, metavar="F",
                        help="once every unit of a round is out, an idle peer races the unit in flight longest "
                        "when it has been out F times the session's median unit time (default "
                        f"{DEFAULT_BACKUP_AFTER:g}; 0: at once); the first result is merged, the other compared")
    parser.add_argument("--no-backups", action="store_true", help="never hand out backups of slow units")
    parser.add_argument("--mode", choices=("sync", "async"), default="sync",
                        help="sync: rounds of k units (default); async: buffered asynchronous merging (FedBuff), "
                        "peers never wait for a round and every --buffer results are merged")
    parser.add_argument("--buffer", type=int, default=None, metavar="K",
                        help="async: results per merge (default: -k)")
    parser.add_argument("--staleness-exponent", type=float, default=0.5, metavar="A",
                        help="async: a result s versions behind is weighted (1 + s) ** -A (default 0.5)")
    parser.add_argument("--max-staleness", type=int, default=20, metavar="S",
                        help="async: a result more than S versions behind is refused (409 too_stale; default 20)")
    parser.add_argument("--validate-every", type=int, default=1, metavar="N",
                        help="async: validate (and plot) every N merges (default 1)")
    parser.add_argument("--round-deadline", type=float, default=None, metavar="S",
                        help="a round merges S seconds after its first unit is handed out with what it has (at "
                        "least --min-results); the units not back open the next round (default: no deadline)")
    parser.add_argument("--min-results", type=int, default=None, metavar="M",
                        help="results a round needs to merge at its deadline (default: half its units)")
    guard.add_argument("--no-ban-addresses", dest="ban_addresses", action="store_false",
                       help="a banned peer's client address may still join (e.g. many volunteers behind one NAT)")
    guard.add_argument("--trusted-proxy-header", metavar="HEADER",
                       help="behind a reverse proxy: read the client address from this header (e.g. "
                       "X-Forwarded-For); never set it on a relay reachable directly")
    parser.add_argument("--join-code", default=os.environ.get("PEERTRAIN_JOIN_CODE"),
                        help="require this code to join (env PEERTRAIN_JOIN_CODE); default: open")
    parser.add_argument("--admin-token", default=os.environ.get("PEERTRAIN_ADMIN_TOKEN"),
                        help="admin token (env PEERTRAIN_ADMIN_TOKEN); default: a new one, printed once")
    parser.add_argument("--peers", type=int, default=0, help="also start N headless Chromium peers")
    parser.add_argument("--no-session", action="store_true", help="serve the page and assets only")
    add_limit_options(parser)  # (server.relay.limits: slow and silent clients)


def keep_results_value(text: str) -> int | None:
    """``--keep-results``: a count of rounds (0 or more), or ``all`` (None: nothing is pruned)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a number of rounds or 'all', got {text!r}") from error
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more rounds, got {value}")
    return value


def bind(host: str, port: int) -> socket.socket:
    """Bind before starting uvicorn so that port 0 yields a real port we can print."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def join_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def build_task_wheel(package_manifest: dict, paths: RelayPaths) -> str | None:
    """A task from a file becomes a wheel browsers install, in the folder the relay serves; returns its
    distribution name."""
    source = package_manifest.get("task_source")
    if not source:
        return None
    from server.browser_assets.wheels import build_wheels

    module = package_manifest["task_import"].partition(":")[0]
    dist = module.replace("_", "-")
    with tempfile.TemporaryDirectory(prefix="peertrain-task-") as tmp:
        folder = Path(tmp) / module
        folder.mkdir()
        shutil.copy(source, folder / "__init__.py")
        build_wheels(REPO_ROOT, extra_packages=[(dist, [folder])], out_dir=paths.wheels, log=lambda _: None)
    return dist


def runs_home() -> Path:
    """Where sessions live by default: ``runs/`` under ``$PEERTRAIN_HOME``, else under the working directory."""
    return Path(os.environ.get("PEERTRAIN_HOME") or Path.cwd()) / "runs"


def open_session(args: argparse.Namespace, paths: RelayPaths):  # type: ignore[no-untyped-def]
    from server.relay.options import RelayOptions
    from server.relay.sqlite_store import Store
    from server.relay.state import Relay
    from server.session.config import SessionConfig
    from server.session.package import Package, build_package
    from server.session.session import Session

    session_dir = args.session_dir or runs_home() / f"session-{Path(args.task).stem}"
    if args.fresh:
        shutil.rmtree(session_dir, ignore_errors=True)
    session_dir.mkdir(parents=True, exist_ok=True)
    if args.package:
        package = Package.load(args.package)
    elif (session_dir / "package" / "manifest.json").is_file():
        package = Package.load(session_dir / "package")
    else:
        package = build_package(args.task, parse_sets(args.sets), session_dir / "package", seed=args.seed)
    wheel = build_task_wheel(package.manifest, paths)
    package.manifest["wheel"] = wheel
    if (session_dir / "session.json").is_file():
        session = Session.restore(session_dir, package)
        print(f"resuming session in {session_dir} after round {session.round} of {session.num_rounds}")
        if session.done:
            print(f"that session has finished ({session.stopped or 'all rounds done'}); "
                  "start over with --fresh (make demo DEMO_ARGS=--fresh)")
    else:
        config = SessionConfig(merge=args.merge, merge_config=json.loads(args.merge_config),
                               aggregate=args.aggregate, aggregate_config=args.aggregate_config,
                               participants=args.buffer if args.mode == "async" and args.buffer
                               else args.participants, passes=args.passes, seed=args.seed,
                               force=args.force, on_divergence=args.on_divergence, mode=args.mode,
                               staleness_exponent=args.staleness_exponent, max_staleness=args.max_staleness,
                               validate_every=args.validate_every)
        session = Session.create(package, config, directory=session_dir)
        print(f"new session in {session_dir}: {session.num_rounds} rounds of {args.participants} units")
    admin_token = args.admin_token or secrets.token_urlsafe(18)
    if not args.admin_token:
        print(f"admin token (shown once): {admin_token}")
    options = RelayOptions(admin_token=admin_token, join_code=args.join_code, lease_seconds=args.lease_seconds,
                           peer_timeout=args.peer_timeout, min_peers=args.min_peers,
                           max_update_norm=args.max_update_norm, outlier_factor=args.outlier_factor,
                           join_rate=args.join_rate, join_burst=args.join_burst,
                           max_peers_per_address=args.max_peers_per_address,
                           trusted_proxy_header=args.trusted_proxy_header, verify=args.verify,
                           verify_fraction=args.verify_fraction, verify_atol=args.verify_atol,
                           verify_rtol=args.verify_rtol if args.verify_rtol is not None
                           else package.task.replay_rtol or DEFAULT_VERIFY_RTOL,
                           ban_addresses=args.ban_addresses, redundancy=args.redundancy,
                           backup_after=None if args.no_backups else args.backup_after,
                           round_deadline=args.round_deadline, min_results=args.min_results,
                           public_model=args.public_model, keep_results=args.keep_results)
    if options.round_deadline is not None and not options.round_deadline > 0:
        raise ValueError(f"--round-deadline must be a number of seconds above 0, got {options.round_deadline:g}")
    if options.min_results is not None and options.min_results < 1:
        raise ValueError(f"--min-results must be 1 or more, got {options.min_results}")
    if not 0 <= options.redundancy <= 1:
        raise ValueError(f"--redundancy must be a share between 0 and 1, got {options.redundancy:g}")
    if session.config.mode == "async":
        if options.redundancy or options.round_deadline is not None:
            raise ValueError("--redundancy and --round-deadline belong to synchronous rounds; not with --mode async")
        if options.verify:
            print("async mode: host replays, second copies and backups are synchronous-round features and are off; "
                  "the result checks (counts, update norms) and the aggregator remain")
            options.verify = False
    if package.task.kind == "local":
        check_local_session(package, options, session)
    if options.verify and not package.task.replay_across_engines and not args.force_verify:
        print(f"host replays are off: a {package.task.name} unit trained in a browser and natively can part ways "
              "(float rounding differences grow into different weights), so a replay cannot judge it; the other "
              "checks remain")
        options.verify = False
    if options.verify and package.manifest.get("replayable") is False:
        raise ValueError(f"task {package.task.name} is not replayable: training unit 0 twice at set-up gave "
                         "different weights (does it read the clock or an unseeded generator?), so results cannot "
                         "be verified by replay; make train_unit depend only on (weights, unit, settings), or serve "
                         "with --no-verify")
    return Relay(session=session, package=package, store=Store(session_dir / "relay.sqlite3"), options=options)


def check_local_session(package, options, session) -> None:  # type: ignore[no-untyped-def]
    """A local task (peers train on their own files): no replays, no second copies; say how it is judged."""
    if options.redundancy:
        raise ValueError(f"--redundancy compares two peers' results of one unit, but {package.task.name} trains each "
                         "unit on a peer's own files, so no two results can agree; serve it without --redundancy")
    if options.verify:
        print(f"host replays are off: {package.task.name} trains on each peer's own files, which the host never sees, "
              "so a result cannot be replayed; robust aggregation and the update checks remain")
        options.verify = False
    if not session.host_validates:
        print("no validation split on the host: the session is judged by federated evaluation (the peers' metrics "
              "of the weights each round starts from, on their own held-out examples)")


def run(args: argparse.Namespace, paths: RelayPaths | None = None) -> int:
    paths = paths or RelayPaths()
    problems = paths.missing()
    if problems:
        for problem in problems:
            print(f"peertrain serve: {problem}", file=sys.stderr)
        return 2
    try:
        limits = limits_from_args(args)
    except ValueError as error:
        print(f"peertrain serve: {error}", file=sys.stderr)
        return 2
    raise_file_limit(limits.limit_concurrency)
    try:
        sock = bind(args.host, args.port)
    except OSError as error:
        print(f"peertrain serve: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 2
    relay = None
    if not args.no_session:
        from runtime.planner import PlanError
        from runtime.tasks import TaskError

        try:
            relay = open_session(args, paths)
        except (TaskError, PlanError, ValueError, FileNotFoundError) as error:
            sock.close()
            print(f"peertrain serve: {error}", file=sys.stderr)
            return 2
    url = join_url(args.host, sock.getsockname()[1])
    print(f"peertrain relay listening. Open {url} in a browser to join.", flush=True)
    peers = None
    if args.peers > 0:
        peers = subprocess.Popen([sys.executable, "-m", "server.cli", "peers", str(args.peers), "--url", url])
    # Open event streams would hold a graceful shutdown forever: give them a few seconds.
    def on_header_timeout() -> None:  # (counted, not announced: a slow client cannot wake every event stream)
        if relay is not None:
            relay.store.count("refused.header_timeout")

    config = uvicorn.Config(create_app(paths, relay, limits), log_level=args.log_level, lifespan="on",
                            timeout_graceful_shutdown=3, **limits.uvicorn_settings(on_header_timeout))
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if peers is not None:
            peers.terminate()
        if relay is not None:
            relay.close()  # (the app's lifespan closes it too; a failed start-up never ran it)
    return 0
