"""``peertrain bench chaos``: a relay killed with SIGKILL again and again, and a full disk, with peers that retry.

A real ``peertrain serve`` runs the majority example (a unit trains in milliseconds, so a session has many
rounds to interrupt) on a fixed port; native peers in threads do what the browser's worker does (join, ask for
work, fetch the weights and the unit, train with ``runtime.peer.Peer``, upload) and retry through every
refused connection and 5xx. A killer sends SIGKILL at chosen moments, in turn:

* ``upload``: while a peer's result upload is in flight;
* ``merge``: a random moment between a round's last result and the next round opening (the merge, the
  validation, the checkpoint);
* ``checkpoint``: the moment the next round's checkpoint folder appears, before ``latest`` points at it;
* ``random``: any moment.

After each kill the disk says what was interrupted (a round folder newer than ``latest``: a checkpoint being
written), the relay is started again on the same folder, and the peers reconnect by themselves. At the end:

* synchronous rounds: the final weights are bit-identical to the same session trained in-process without a
  relay (every unit trained natively, merged in slot order);
* asynchronous mode (``--mode async``): the final weights are those of replaying the recorded arrivals through
  a fresh session (``server.session.buffered.replay``); every result message is kept for that replay;
* units lost: every unit of the plan merged exactly once per pass (sync: the history's units; async: the
  arrivals' entries), none twice.

``--full-disk`` runs the session folder on a small tmpfs the bench mounts (root only): after a few rounds a
filler file takes the free space; the relay must answer 503 ``disk_full`` with a reason, keep its last good
checkpoint (readable, unchanged), and resume on its own when the filler is removed; the end is again checked
against the uninterrupted run. The anchor of every figure is the uninterrupted run in the same bench.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from runtime import wire
from server.bench.chaos_relay import EXAMPLES, RelayProcess, Uploads, chaos_relay, retrying_peer, wait_until
from server.bench.full_disk import DiskFiller, small_filesystem
from server.harness.serve_command import ServeCommand
from server.relay.options import DEFAULT_KEEP_RESULTS, RelayOptions
from server.session import checkpoint_files as checkpoint
from server.session.config import SessionConfig

ADMIN = "chaos-admin"
TRIGGERS = ("upload", "merge", "checkpoint", "random")
FULL_DISK_MB = 32  # the tmpfs of the full-disk run (its session needs under 1 MB: the filler takes the rest)


@dataclass
class ChaosConfig:
    kills: int = 12
    mode: str = "sync"
    peers: int = 3
    k: int = 3
    passes: int = 6
    chunks: int = 6
    examples: int = 1536
    epochs: int = 2
    hidden: int = 8192  # the model's width: big enough that writing a checkpoint takes a few milliseconds
    seed: int = 0
    timeout_s: float = 600.0
    full_disk: bool = False

    def serve_command(self, session_dir: Path) -> ServeCommand:
        # Rollback: its loss falls to ~1e-4, where noise trips the watch. Async: the replay of the arrivals needs
        # every message.
        config = SessionConfig(participants=self.k, passes=self.passes, seed=self.seed, mode=self.mode,
                               on_divergence="rollback")
        options = RelayOptions(admin_token=ADMIN, lease_seconds=10,
                               keep_results=None if self.mode == "async" else DEFAULT_KEEP_RESULTS)
        settings = {"chunks": self.chunks, "examples": self.examples, "epochs": self.epochs, "hidden": self.hidden}
        return ServeCommand(task="majority_task:MajorityTask", task_settings=settings, session_dir=session_dir,
                            config=config, options=options)


@dataclass
class Kill:
    trigger: str
    interrupted: str  # what the disk and the peers say was going on
    round: int  # rounds merged when it was killed (the checkpoint's)
    restart_seconds: float


@dataclass
class ChaosReport:
    mode: str
    kills: list[Kill]
    seconds: float
    uninterrupted_seconds: float
    rounds: int
    units_lost: int
    units_twice: int
    final_sha256: str
    expected_sha256: str
    uploads: dict[str, int]
    peer_errors: list[str]
    disk: dict[str, Any] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return self.final_sha256 == self.expected_sha256

    def ok(self) -> bool:
        return self.identical and self.units_lost == 0 and self.units_twice == 0 and not self.peer_errors


def weights_sha256(weights: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(weights, dtype=np.float32).tobytes()).hexdigest()


def disk_state(session_dir: Path) -> tuple[int, int]:
    """(rounds in the latest checkpoint, the newest round folder on disk; larger: a checkpoint being written)."""
    try:
        latest = int(checkpoint.latest_folder(session_dir).name)
    except (checkpoint.CheckpointError, ValueError, OSError):
        latest = -1
    folders = [int(p.name) for p in (session_dir / checkpoint.ROUNDS_DIR).glob("[0-9]*")] \
        if (session_dir / checkpoint.ROUNDS_DIR).is_dir() else []
    return latest, max(folders, default=-1)


class Killer:
    """Chooses the moments and kills; classifies each kill by what the disk and the peers show. The moments are
    events the peers report (an upload in flight, a round's last result accepted) or the disk shows (a checkpoint
    folder), not looks at the relay's status, which can come after the moment passed."""

    def __init__(self, relay: RelayProcess, session_dir: Path, uploads: Uploads, seed: int, k: int) -> None:
        self.relay, self.session_dir, self.uploads = relay, session_dir, uploads
        self.rng = random.Random(seed)
        self.k = k
        self.merge_seconds = 0.01  # the window a merge kill aims into: the first half of the merge timed last
        self.observer = httpx.Client(base_url=relay.url, timeout=5)

    def status(self) -> dict[str, Any] | None:
        try:
            response = self.observer.get("/api/session")
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def next_full_round(self, limit_s: float) -> bool:
        """Until the peers report the next round whose every result was accepted (its merge starts now)."""
        seen = len(self.uploads.full_rounds)
        return wait_until(self.uploads, lambda: len(self.uploads.full_rounds) > seen, limit_s)

    def kill_at(self, trigger: str, limit_s: float = 20) -> Kill | None:
        """Wait for the moment of ``trigger`` and kill there (None: the moment never came)."""
        if trigger == "random":
            time.sleep(self.rng.uniform(0.1, 1.5))
            return self.kill(trigger)
        if trigger == "upload":
            with self.uploads.changed:  # held through the SIGKILL: no upload in flight can be answered meanwhile
                if not self.uploads.changed.wait_for(lambda: self.uploads.in_flight > 0, timeout=limit_s):
                    return None
                in_flight = self.uploads.in_flight
                self.relay.kill()
            return self.restarted(trigger, in_flight)
        if trigger == "checkpoint":
            latest, _ = disk_state(self.session_dir)
            target = checkpoint.round_folder(self.session_dir, latest + 1)
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline:  # (a folder appearing on disk: nothing to wait on but the disk)
                if target.exists():
                    return self.kill(trigger)
                time.sleep(0.0002)
            return None
        return self.kill_in_merge(limit_s)

    def kill_in_merge(self, limit_s: float) -> Kill | None:
        """Kill a moment into the next merge: armed on ``uploads``, the kill runs in the thread of the peer whose
        upload was the merge's last result, as its `accepted` comes back (a wake-up of this thread would come
        after a merge of a few milliseconds is on disk). None: no merge started within ``limit_s``."""
        delay = self.rng.uniform(0, self.merge_seconds)
        struck: dict[str, int] = {}

        def strike() -> None:
            struck["before"], _ = disk_state(self.session_dir)
            time.sleep(delay)
            struck["in_flight"] = self.uploads.in_flight
            self.relay.kill()

        with self.uploads.changed:
            self.uploads.armed = strike
            if not self.uploads.changed.wait_for(lambda: "in_flight" in struck, timeout=limit_s):
                self.uploads.armed = None
                return None
        return self.restarted("merge", struck["in_flight"], struck["before"])

    def kill(self, trigger: str) -> Kill:
        in_flight = self.uploads.in_flight
        self.relay.kill()
        return self.restarted(trigger, in_flight)

    def restarted(self, trigger: str, in_flight: int, checkpoint_before: int | None = None) -> Kill:
        """What the killed relay was doing (the disk and the peers say), then its restart."""
        latest, newest = disk_state(self.session_dir)
        if newest > latest:
            interrupted = "while writing a checkpoint"
        elif trigger == "merge" and latest == checkpoint_before:
            interrupted = "during a merge, before its checkpoint"
        elif in_flight:
            interrupted = "during an upload"
        else:
            interrupted = "between requests"
        restart = self.relay.start()
        return Kill(trigger, interrupted, latest, restart)

    def learn_merge_time(self) -> None:
        """Time one merge, from its round's last result to its checkpoint; the ``merge`` trigger aims into its
        first half (a moment drawn past the checkpoint would be a kill between requests)."""
        before, _ = disk_state(self.session_dir)
        if not self.next_full_round(10):
            return
        full_at, deadline = time.monotonic(), time.monotonic() + 10
        while time.monotonic() < deadline:  # (the checkpoint's ``latest`` changing on disk)
            if disk_state(self.session_dir)[0] > before:
                self.merge_seconds = max(0.001, 0.5 * (time.monotonic() - full_at))
                return
            time.sleep(0.001)


def expected_weights(session_dir: Path, mode: str) -> np.ndarray:
    """The anchor: sync, the same session trained in-process without a relay; async, the recorded arrivals
    replayed through a fresh session."""
    from server.relay.store import open_store
    from server.session.buffered import Arrival, replay
    from server.session.package import Package
    from server.session.session import Session

    package = Package.load(session_dir / "package")
    config = SessionConfig.from_json(checkpoint.read_session_config(session_dir)["config"])
    session = Session.create(package, config)
    if mode == "async":
        store = open_store(session_dir / "relay.sqlite3")
        try:
            arrivals = [Arrival(seq, entry, unit, version, merge, examples, metrics, wire.decode(message)[1])
                        for seq, entry, unit, version, merge, examples, metrics, message in store.arrivals()]
        finally:
            store.close()
        return np.asarray(replay(session, arrivals, exponent=config.staleness_exponent,
                                 validate_every=config.validate_every).weights)
    while not session.done:
        session.complete_round([(a, package.task.train_unit(session.weights, session.work_unit(a)))
                                for a in session.assignments()])
    return session.weights


def units_lost_and_twice(session_dir: Path, mode: str, history: list[dict[str, Any]]) -> tuple[int, int]:
    """Units of the plan never merged, and merged more often than the plan says."""
    from server.relay.store import open_store
    from server.session.package import Package
    from server.session.session import Session

    package = Package.load(session_dir / "package")
    config = SessionConfig.from_json(checkpoint.read_session_config(session_dir)["config"])
    planned = Counter(unit for _, unit in Session.create(package, config).plan.schedule)
    if mode == "async":
        store = open_store(session_dir / "relay.sqlite3")
        try:
            merged = Counter(unit for _, _, unit, _, _, _, _, _ in store.arrivals())
        finally:
            store.close()
    else:
        merged = Counter(unit for entry in history for unit in entry["units"])
    lost = sum((planned - merged).values())
    twice = sum((merged - planned).values())
    return lost, twice


def final_status(url: str) -> tuple[dict[str, Any], np.ndarray]:
    from server.session.export import exported_weights

    with httpx.Client(base_url=url, timeout=30) as client:
        status = client.get("/api/session").json()
        model = client.get("/api/admin/export/model", headers={"Authorization": f"Bearer {ADMIN}"})
        history = client.get("/api/admin/export/history", headers={"Authorization": f"Bearer {ADMIN}"})
    status["full_history"] = [json.loads(line) for line in history.text.splitlines() if line.strip()]
    return status, exported_weights(model.content)


def run_session(config: ChaosConfig, work: Path, *, kills: int, log: Any = print,
                disk: DiskFiller | None = None) -> ChaosReport:
    """One session with ``kills`` SIGKILLs (0: the uninterrupted anchor) or a full disk; the report."""
    session_dir = work / "session"
    work.mkdir(parents=True, exist_ok=True)
    relay = chaos_relay(config.serve_command(session_dir), work.parent / f"{work.name}-serve.log")
    # A merge starts when a round's k results are in (sync), or when the buffer of k results fills (async).
    uploads, stop = Uploads(slots=config.k, per_round=config.mode == "sync"), threading.Event()
    started = time.monotonic()
    deadline = started + config.timeout_s
    relay.start()  # (the first start builds the package)
    peers = [retrying_peer(relay.url, uploads, stop, deadline) for _ in range(config.peers)]
    for peer in peers:
        peer.start()
    killer = Killer(relay, session_dir, uploads, config.seed, config.k)
    done: list[Kill] = []
    disk_figures: dict[str, Any] = {}
    try:
        if kills:
            killer.learn_merge_time()
        for index in range(kills):
            trigger = TRIGGERS[index % len(TRIGGERS)]
            status = killer.status()
            if status is None or status["done"]:
                log(f"  the session finished after {len(done)} kills; the rest were not needed")
                break
            kill = killer.kill_at(trigger) or killer.kill_at("random")
            assert kill is not None
            done.append(kill)
            log(f"  kill {len(done)}/{kills} ({kill.trigger}): {kill.interrupted}, checkpoint at round "
                f"{kill.round}; restarted in {kill.restart_seconds:.2f} s")
        if disk is not None:
            disk_figures = disk.run(killer.status, log)
        for peer in peers:  # each ends when the relay tells it the session is done
            peer.join(timeout=max(0.0, deadline - time.monotonic()))
        if any(peer.is_alive() for peer in peers):
            raise TimeoutError(f"the session did not finish within {config.timeout_s:.0f} s; see {relay.log}")
        status, final = final_status(relay.url)
    finally:
        stop.set()
        for peer in peers:
            peer.join(timeout=10)
        killer.observer.close()
        relay.stop()
    seconds = time.monotonic() - started
    lost, twice = units_lost_and_twice(session_dir, config.mode, status["full_history"])
    expected = expected_weights(session_dir, config.mode)
    return ChaosReport(mode=config.mode, kills=done, seconds=seconds, uninterrupted_seconds=0.0,
                       rounds=int(status["round"]), units_lost=lost, units_twice=twice,
                       final_sha256=weights_sha256(final), expected_sha256=weights_sha256(expected),
                       uploads=dict(uploads.by_status), peer_errors=[repr(p.error) for p in peers if p.error],
                       disk=disk_figures | ({"503_reasons": dict(Counter(uploads.service_unavailable))}
                                            if disk is not None else {}))


# ---------------------------------------------------------------- the bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kills", type=int, default=12, help="SIGKILLs per session (default 12)")
    parser.add_argument("--modes", default="sync,async", help="sync, async or both (default sync,async)")
    parser.add_argument("--peers", type=int, default=3, help="native peers (default 3)")
    parser.add_argument("-k", type=int, default=3, help="units per round, and the async buffer (default 3)")
    parser.add_argument("--passes", type=int, default=6, help="passes over the 6 units (default 6: 12 rounds)")
    parser.add_argument("--seed", type=int, default=0, help="the session's and the killer's seed")
    parser.add_argument("--no-full-disk", dest="full_disk", action="store_false",
                        help="skip the full-disk run (it mounts a tmpfs, so it needs root)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a session may take (default 600)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/chaos.json"), help="figures as JSON")


def run(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= {"sync", "async"}:
        print(f"peertrain bench chaos: --modes takes sync and async, got {args.modes!r}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(EXAMPLES))  # the peers import majority_task as the relay does
    reports: list[dict[str, Any]] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="peertrain-chaos-") as temporary:
        work = Path(temporary)
        for mode in modes:
            config = ChaosConfig(kills=args.kills, mode=mode, peers=args.peers, k=args.k, passes=args.passes,
                                 seed=args.seed, timeout_s=args.timeout)
            print(f"{mode}: the uninterrupted anchor ...", flush=True)
            anchor = run_session(config, work / f"{mode}-anchor", kills=0)
            print(f"{mode}: {anchor.rounds} rounds in {anchor.seconds:.1f} s; now {args.kills} kills ...", flush=True)
            report = run_session(config, work / f"{mode}-kills", kills=args.kills,
                                 log=lambda line: print(line, flush=True))
            report.uninterrupted_seconds = anchor.seconds
            ok &= report.ok()
            reports.append(asdict(report) | {"identical": report.identical, "anchor_sha256": anchor.final_sha256})
            print_report(report, anchor)
        if args.full_disk:
            try:
                with small_filesystem(FULL_DISK_MB) as mount:
                    config = ChaosConfig(kills=0, mode="sync", peers=args.peers, k=args.k, passes=args.passes,
                                         seed=args.seed, timeout_s=args.timeout, hidden=256)
                    print(f"full disk: a {FULL_DISK_MB} MB tmpfs holds the session ...", flush=True)
                    filler = DiskFiller(mount / "session")
                    report = run_session(config, mount, kills=0, log=lambda line: print(line, flush=True),
                                         disk=filler)
                    ok &= report.ok() and bool(report.disk.get("checkpoint_kept"))
                    reports.append(asdict(report) | {"identical": report.identical})
                    print(f"full disk: 503 answers by reason {report.disk['503_reasons']}; final weights equal "
                          f"the uninterrupted run: {report.identical}; units lost {report.units_lost}")
            except PermissionError as error:
                print(f"full disk: skipped ({error})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(reports, indent=1) + "\n")
    print(f"figures written to {args.out}; {'all checks passed' if ok else 'A CHECK FAILED'}")
    return 0 if ok else 1


def print_report(report: ChaosReport, anchor: ChaosReport) -> None:
    moments = Counter(kill.interrupted for kill in report.kills)
    print(f"{report.mode}: {len(report.kills)} kills survived ({', '.join(f'{n} {m}' for m, n in moments.items())})")
    print(f"  rounds {report.rounds} (uninterrupted: {anchor.rounds}); {report.seconds:.1f} s against "
          f"{anchor.seconds:.1f} s uninterrupted ({report.seconds / max(anchor.seconds, 1e-9):.2f}x)")
    print(f"  units lost {report.units_lost}, merged twice {report.units_twice}; final weights "
          f"{'bit-identical to' if report.identical else 'DIFFER from'} the "
          f"{'replay of the recorded arrivals' if report.mode == 'async' else 'uninterrupted run'} "
          f"(sha256 {report.final_sha256[:16]})")
    print(f"  uploads: {dict(sorted(report.uploads.items()))}; peer errors: {report.peer_errors or 'none'}")
