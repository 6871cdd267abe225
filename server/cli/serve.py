"""``peertrain serve``: build or resume a session, bind, print the URL to join, run the relay under uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from server.browser_assets import engines
from server.cli.options import (
    add_buffer_option,
    add_config_option,
    add_metrics_options,
    add_task_options,
    metrics_targets,
    parse_sets,
    read_limits,
    read_settings,
)
from server.paths import REPO_ROOT
from server.relay.app import RelayPaths, create_app
from server.relay.limits import raise_file_limit, uvicorn_settings
from server.relay.verify import DEFAULT_VERIFY_RTOL
from server.session.settings import add_flags

if TYPE_CHECKING:
    from server.relay.options import ServerLimits

HELP = "start the relay and the page; prints the URL to join"
DESCRIPTION = ("Start (or resume) a session and the relay that serves the page, Pyodide and the wheels, hands out "
               "work and merges results.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from server.relay.options import RelayOptions, ServerLimits
    from server.session.config import SessionConfig

    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--tls-cert", type=Path, metavar="FILE",
                        help="serve HTTPS with this certificate (PEM, the chain after the leaf), for a relay that "
                        "faces the internet without a reverse proxy: a page gets a secure context (WebGPU) only over "
                        "HTTPS")
    parser.add_argument("--tls-key", type=Path, metavar="FILE", help="the certificate's private key (PEM)")
    add_task_options(parser, seed=False)
    parser.add_argument("--package", type=Path, help="a package built with `peertrain package` (else built here)")
    parser.add_argument("--session-dir", type=Path, help="where checkpoints and the SQLite file live "
                        "(default: runs/session-<task> under $PEERTRAIN_HOME, else under the working directory); "
                        "an existing session there is resumed")
    parser.add_argument("--fresh", action="store_true", help="discard an existing session in --session-dir (and, "
                        "with --store postgresql://..., drop its tables in that database)")
    parser.add_argument("--store", metavar="URL", help="where the relay keeps peers, leases, results, bans and "
                        "counters: postgresql://USER:PASSWORD@HOST:PORT/DATABASE (psycopg 3; one database per "
                        "session) or sqlite:///PATH (default: relay.sqlite3 in --session-dir); checkpoints and "
                        "history stay in --session-dir. A second serve over the same PostgreSQL and --session-dir "
                        "serves the session beside the first (a replica: hands out units and takes results, which "
                        "the first judges and merges) and takes the session over when the first stops")
    add_metrics_options(parser, "--session-dir")
    add_config_option(parser, "serve")
    session = parser.add_argument_group("the session (server.session.config.SessionConfig; a --config file's keys)")
    asynchronous = parser.add_argument_group("buffered asynchronous mode")
    relay = parser.add_argument_group("the relay (server.relay.options.RelayOptions; a --config file's keys)")
    rounds = parser.add_argument_group("slow peers: backups and round deadlines")
    guard = parser.add_argument_group("an open session's guards (anyone with the URL can join)")
    privacy = parser.add_argument_group("user-level differential privacy (docs/sessions/privacy.md)")
    groups = {"": session, "async": asynchronous, "privacy": privacy}
    add_flags(parser, SessionConfig, "serve", groups=groups)
    add_buffer_option(asynchronous)
    add_flags(parser, RelayOptions, "serve", groups={"": relay, "rounds": rounds, "guards": guard})
    guard.add_argument("--force-verify", action="store_true",
                       help="replay even a task that declares its browser and native units can part ways (only "
                       "for sessions whose peers all run natively, e.g. the benches)")
    parser.add_argument("--peers", type=int, default=0, help="also start N headless Chromium peers")
    parser.add_argument("--no-session", action="store_true", help="serve the page and assets only")
    limits = parser.add_argument_group("connection limits: slow or silent clients (server.relay.options.ServerLimits; "
                                       "a --config file's keys)")
    add_flags(parser, ServerLimits, "serve", groups={"": limits})


def bind(host: str, port: int) -> socket.socket:
    """Bind before starting uvicorn so that port 0 yields a real port we can print."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def join_url(host: str, port: int, *, tls: bool = False) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"{'https' if tls else 'http'}://{shown}:{port}/"


def check_tls(cert: Path | None, key: Path | None) -> str | None:
    """Why ``--tls-cert``/``--tls-key`` cannot serve (None: they can, or neither is given)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        return "--tls-cert and --tls-key go together: the certificate and its private key"
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except FileNotFoundError as error:
        return f"cannot read {error.filename}"
    except ssl.SSLError as error:
        return f"--tls-cert {cert} and --tls-key {key} are not a PEM certificate and its key: {error}"
    return None


def build_task_wheel(package_manifest: dict, wheels: Path) -> str | None:
    """A task from a file becomes a wheel browsers install: built, with the runtime's and Pyodide's wheels and their
    lock, into ``wheels``, the session's own folder (``session_wheels``), which its relay serves in place of the
    install's. Returns the wheel's distribution name (None: the task is not from a file).

    Not into the install's ``wheels/``: every relay on the machine serves that folder, and a rebuild there (the
    folder removed and put back) failed the pages booting from another relay meanwhile and handed them this task's
    lock."""
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
        build_wheels(REPO_ROOT, extra_packages=[(dist, [folder])], out_dir=wheels, log=lambda _: None)
    return dist


def unserved_task_note(package_manifest: dict, replay_engine: str = "auto") -> str | None:
    """A warning where the task's module is neither the runtime's nor a file ``serve`` builds a wheel of: it was
    imported from this machine's Python path, which no browser (and no Pyodide replay on the host) has."""
    module = engines.host_only_task(package_manifest)
    if module is None:
        return None
    stem = module.rpartition(".")[2]
    replays = ("the host's Pyodide replays of results fail to run (each counted as replays_failed_on_host, the result "
               "unchecked)" if replay_engine == "pyodide" else
               "the host replays its results natively instead of on the browser's engine")  # (auto, native)
    return (f"warning: the task module {module} comes from this machine's Python path: browsers cannot install it "
            f"(their workers fail to import it) and {replays}; give the task as a file (--task path/to/{stem}.py) "
            "to serve it to browsers as a wheel")


def session_wheels(session_dir: Path) -> Path:
    """The folder of wheels a session whose task is a file serves (its task's wheel among them)."""
    return session_dir / "wheels"


def runs_home() -> Path:
    """Where sessions live by default: ``runs/`` under ``$PEERTRAIN_HOME``, else under the working directory."""
    return Path(os.environ.get("PEERTRAIN_HOME") or Path.cwd()) / "runs"


def session_folder(args: argparse.Namespace) -> Path:
    return Path(args.session_dir or runs_home() / f"session-{Path(args.task).stem}")


def store_location(args: argparse.Namespace) -> str:
    """Where the session's store lives: --store, else the SQLite file in the session folder."""
    return str(args.store or session_folder(args) / "relay.sqlite3")


HOLD_CHECK_SECONDS = 1.0  # how often the serving relay makes sure it still holds its session


def hold_the_session(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """With a database server's store: the session's hold and whether this relay is a replica. A second relay
    serves beside the one holding the session, at once, as a replica (``server.relay.sharing``), and takes the hold
    when that relay dies. (None, False) with a SQLite file. A relay told --fresh does not start beside another: it
    would wipe the session that one serves."""
    from server.relay.store.location import hold_server_session

    hold = hold_server_session(store_location(args))
    if hold is None or hold.take():
        return hold, False
    if args.fresh:
        hold.close()
        raise ValueError("another relay serves this session; --fresh would drop its tables: stop it first")
    print("another relay holds this session (its store's hold is taken): this one serves it beside that one "
          "as a replica (hands out units, takes results; that relay judges and merges them) and takes the session "
          "over when it stops", flush=True)
    return hold, True


def keep_watch(hold) -> None:  # type: ignore[no-untyped-def]
    """A thread that stops this process at once if its hold on the session is lost (the database dropped its
    connection: another relay may take the session over, and two must never serve it)."""
    def watch() -> None:
        while not hold.closed and hold.held():
            time.sleep(HOLD_CHECK_SECONDS)
        if hold.closed:  # (let go on purpose: the relay stops, or never started)
            return
        print("peertrain serve: the hold on the session was lost (its database connection dropped); stopping so "
              "that only one relay serves it", file=sys.stderr, flush=True)
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="session-hold").start()


def open_session(args: argparse.Namespace, *, replica: bool = False):  # type: ignore[no-untyped-def]
    """The relay of the session in --session-dir (resumed, else new): the settings read (flags over the
    --config file over the declared defaults), checked, and made consistent by ``server.session.rules.resolve``
    before anything is written."""
    from server.relay.options import RelayOptions
    from server.relay.state import Relay
    from server.relay.store import open_store
    from server.relay.store.location import StoreInUse, erase_server_store, server_holds_a_session
    from server.session.config import SessionConfig
    from server.session.following import open_beside
    from server.session.package import Package, build_package
    from server.session.rules import resolve
    from server.session.session import Session

    config_values, relay_values = read_settings(args, "serve")
    session_dir, location = session_folder(args), store_location(args)
    if args.fresh:
        shutil.rmtree(session_dir, ignore_errors=True)
        erase_server_store(location)
    resuming = (session_dir / "session.json").is_file()
    if not resuming and server_holds_a_session(location):
        raise StoreInUse(f"the database in --store holds another session's state and {session_dir} has no "
                         "session.json to resume it with: give that --session-dir, or --fresh to drop the tables, "
                         "or another database")
    config = SessionConfig(**config_values)  # (checked even when resuming: a bad flag is refused either way)
    session_dir.mkdir(parents=True, exist_ok=True)
    targets = metrics_targets(args, session_dir)  # (after --fresh emptied the folder a local MLflow store goes in)
    if args.package:
        package = Package.load(args.package)
    elif (session_dir / "package" / "manifest.json").is_file():
        package = Package.load(session_dir / "package")
    else:
        package = build_package(args.task, parse_sets(args.sets), session_dir / "package",
                                seed=config_values.get("seed", 0))
    round_log = targets.log() if targets is not None else None  # (Relay.close closes it; a replica's begins when it
    #                                                               takes the session over: server.relay.sharing)
    try:
        session = None if not resuming else open_beside(session_dir, package, round_log) if replica else \
            Session.restore(session_dir, package, round_log=round_log)
        relay_values.setdefault("verify_rtol", package.task.replay_rtol or DEFAULT_VERIFY_RTOL)
        admin_token = relay_values.get("admin_token") or secrets.token_urlsafe(18)
        if not relay_values.get("admin_token"):
            print(f"admin token (shown once): {admin_token}")
        options = RelayOptions(**{**relay_values, "admin_token": admin_token})
        resolved = resolve(session.config if session is not None else config, options, package,
                           force_verify=args.force_verify)
        for note in resolved.notes:
            print(note)
        package.manifest["wheel"] = build_task_wheel(package.manifest, session_wheels(session_dir))
        unserved = unserved_task_note(package.manifest, resolved.options.replay_engine)
        if unserved:
            print(unserved)
        if session is not None:
            print(f"resuming session in {session_dir} after round {session.round} of {session.num_rounds}")
            if session.done:
                print(f"that session has finished ({session.stopped or 'all rounds done'}); "
                      "start over with --fresh (make demo DEMO_ARGS=--fresh)")
        else:
            session = Session.create(package, resolved.config, directory=session_dir, round_log=round_log)
            print(f"new session in {session_dir}: {session.num_rounds} rounds of {session.config.participants} units")
        return Relay(session=session, package=package, store=open_store(location), options=resolved.options,
                     replica=replica)
    except BaseException:
        if round_log is not None:
            round_log.close()
        raise


def run(args: argparse.Namespace, paths: RelayPaths | None = None) -> int:
    paths = paths or RelayPaths()
    problems = paths.missing()
    if problems:
        for problem in problems:
            print(f"peertrain serve: {problem}", file=sys.stderr)
        return 2
    try:
        limits = read_limits(args)
    except ValueError as error:
        print(f"peertrain serve: {error}", file=sys.stderr)
        return 2
    raise_file_limit(limits.limit_concurrency)
    unusable = check_tls(args.tls_cert, args.tls_key)
    if unusable is not None:
        print(f"peertrain serve: {unusable}", file=sys.stderr)
        return 2
    hold, replica = None, False
    if not args.no_session:
        from server.relay.store.location import StoreUnavailable

        try:
            hold, replica = hold_the_session(args)
        except (StoreUnavailable, ValueError) as error:
            print(f"peertrain serve: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 0
        if hold is not None and not replica:
            keep_watch(hold)
    try:
        return serve_session(args, paths, limits, hold=hold if replica else None)
    finally:
        if hold is not None:
            hold.close()  # (on every way out: a relay waiting to take over takes the session now)


def terminated(signum: int, frame: object) -> None:
    """SIGTERM once uvicorn has shut down gracefully (it re-raises the signal it caught): leave through the
    ``finally`` blocks (the headless peers stopped, the relay closed, the session's hold let go), with the exit code
    a shell gives a process SIGTERM ended. Without it the default action killed serve before them, and a ``--peers``
    process (with its Chromium) outlived its relay."""
    raise SystemExit(128 + signal.SIGTERM)


def serve_session(args: argparse.Namespace, paths: RelayPaths, limits: ServerLimits, *,
                  hold=None) -> int:  # type: ignore[no-untyped-def]
    """Listen, open the session (unless --no-session) and serve it until stopped; 2 when it cannot. ``hold``: the
    session's hold another relay has: this one serves as its replica, and takes the hold when it can."""
    try:
        sock = bind(args.host, args.port)
    except OSError as error:
        print(f"peertrain serve: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 2
    relay = None
    if not args.no_session:
        from runtime.planner import PlanError
        from runtime.tasks import TaskError
        from server.relay.store.location import StoreUnavailable

        try:
            relay = open_session(args, replica=hold is not None)
            if hold is not None:  # (the relay asks for the hold now and then, and watches it once taken)
                relay.sharing.take_hold, relay.sharing.on_held = hold.take, lambda: keep_watch(hold)
            if relay.package.manifest.get("wheel"):  # (a task from a file: its own wheels, its task's among them)
                paths = dataclasses.replace(paths, wheels=session_wheels(session_folder(args)))
            if relay.package.manifest.get("task_source") and not relay.session.done:
                print(relay.verification.dry_run(), flush=True)  # (a task from a file: do its units replay?)
        except (TaskError, PlanError, ValueError, FileNotFoundError, StoreUnavailable) as error:
            sock.close()
            print(f"peertrain serve: {error}", file=sys.stderr)
            return 2
    url = join_url(args.host, sock.getsockname()[1], tls=args.tls_cert is not None)
    print(f"peertrain relay listening. Open {url} in a browser to join.", flush=True)
    peers = None
    if args.peers > 0:
        peers = subprocess.Popen([sys.executable, "-m", "server.cli", "peers", str(args.peers), "--url", url])
    # Open event streams would hold a graceful shutdown forever: give them a few seconds.
    def on_header_timeout() -> None:  # (counted, not announced: a slow client cannot wake every event stream)
        if relay is not None:
            relay.store.count("refused.header_timeout")

    config = uvicorn.Config(create_app(paths, relay, limits), log_level=args.log_level, lifespan="on",
                            timeout_graceful_shutdown=3, ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key,
                            **uvicorn_settings(limits, on_header_timeout))
    previous = signal.signal(signal.SIGTERM, terminated) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if peers is not None:
            peers.terminate()
        if relay is not None:
            relay.close()  # (the app's lifespan closes it too, SIGTERM's way out; a failed start-up never ran it)
    return 0
