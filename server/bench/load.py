"""``peertrain bench load``: many peers and many pages against one real relay for minutes, plus slow clients.

Nobody had run many peers for long: this shows whether the relay's memory stays flat, how fast it answers under
load, whether a unit can get lost, and whether slow or silent clients can hold a round or the event loop.

A real ``peertrain serve`` subprocess on 127.0.0.1 (port 0) serves the majority example (``majority_task``,
imported as a module so that ``serve`` does not rebuild the shared ``wheels/`` folder): 100 chunks of 64 rows,
1 local epoch (a unit trains natively in a few milliseconds, so the relay, not the training, is what is
measured), k = peers / 4 units a round (50 for 200 peers), enough passes that the session outlasts the run.
Backups and host replays stay at ``serve``'s defaults (backups after 1x the median unit time; replays of each
peer's first result and 10% of the rest: a majority unit replays in milliseconds, so replays do not make the
relay CPU-bound); joins are unlimited per address (every simulated peer comes from 127.0.0.1);
``--min-peers 1`` lets the single-peer anchor train alone before the crowd joins.

In the bench process, on one asyncio loop, over loopback:

* ``--peers`` simulated peers (httpx.AsyncClient, one shared pool) do what the page's worker does: join, hold-poll
  ``POST /api/work?hold=S`` (S: the relay's ``limits.hold_seconds``), fetch the weights and the unit, train,
  upload. Training is real (``runtime.peer.Peer``), computed once per (round, unit) and cached: a backup of a
  unit trains the same unit from the same weights, which gives the same bytes, so the cached result is that
  peer's honest result and passes every check and replay. A browser's compute time is simulated by sleeping
  ``--unit-seconds`` x uniform(0.5, 1.5) per unit. After each upload a peer first asks ``POST /api/work``
  without hold: that request is answered at once, so its latency is the relay's ("work" below); held polls
  wait for a round by design and are counted, not timed.
* ``--watchers`` page watchers hold ``GET /api/events`` open (raw streams, chunked encoding decoded) and read
  every event; the bench records when each watcher first sees each round.
* Slow clients, during the middle third of the run: ``--tricklers`` peers that train a unit honestly and upload
  it ``--trickle-rate`` bytes a second (the relay must answer ``408 body_timeout`` at ``--body-timeout`` and a
  backup must take the unit); ``--silent`` connections that open and send nothing (closed at the relay's
  ``--header-timeout``); ``--head-tricklers`` connections that send a request head a byte a second (408
  ``header_timeout``).

Reported, with a progress line every ~30 s: the relay's RSS (``/proc/<pid>/status`` VmRSS, every second) and its
least-squares slope after a warm-up, as MB/min and as % of the RSS at the warm-up's end per minute; p50/p99 of
work (answered at once) and result requests, beside the single-peer figures of the same run (one peer alone,
``--anchor-units`` units, before the crowd joins) and split into with and without slow clients; rounds per
minute beside the bound a unit's time sets; units lost (a unit handed out in a merged round that is neither in
that round's merged units nor carried to the next; and any gap or missing unit in the session history: must
be 0); refusals by code (the relay's counters) and the answers the bench got by status; how long after the first
watcher the last one saw each new round. Figures go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from runtime.peer import Peer
from server.paths import REPO_ROOT
from server.relay.client import AsyncRelayClient, Credentials, result_call, unit_call, weights_call
from server.relay.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT

TASK = "majority_task:MajorityTask"  # examples/majority_task.py, importable with examples/ on the path
EXAMPLES = REPO_ROOT / "examples"
ADMIN = "bench-load"
PROGRESS_SECONDS = 30.0
RSS_SAMPLE_SECONDS = 1.0
STOP_GRACE_SECONDS = 5.0  # after the held polls' longest hold: then whatever is left is cancelled
LAG_PROBE_SECONDS = 0.1
ROUND_RE = re.compile(rb'"round": (\d+), "num_rounds"')  # the session's round, first in the status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=200, help="simulated peers (default 200)")
    parser.add_argument("--watchers", type=int, default=200, help="page watchers on /api/events (default 200)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the crowd runs (default 10)")
    parser.add_argument("-k", "--participants", type=int, default=None, help="units a round (default peers / 4)")
    parser.add_argument("--chunks", type=int, default=100, help="units a pass (default 100)")
    parser.add_argument("--rows", type=int, default=64, help="rows of bits a unit (default 64)")
    parser.add_argument("--unit-seconds", type=float, default=2.0,
                        help="a browser's simulated compute time a unit, times uniform(0.5, 1.5) (default 2)")
    parser.add_argument("--anchor-units", type=int, default=30, help="units the single peer trains alone (30)")
    parser.add_argument("--tricklers", type=int, default=5, help="peers uploading a trickle (default 5)")
    parser.add_argument("--trickle-rate", type=int, default=4, help="their bytes a second (default 4)")
    parser.add_argument("--silent", type=int, default=20, help="connections that send nothing (default 20)")
    parser.add_argument("--head-tricklers", type=int, default=5,
                        help="connections trickling a request head a byte a second (default 5)")
    parser.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT, help="serve --body-timeout")
    parser.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT,
                        help="serve --header-timeout")
    parser.add_argument("--warm-up", type=float, default=None,
                        help="seconds before the memory slope starts (default 60, at most a fifth of the run)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="one more `peertrain serve` argument (repeat; e.g. --serve-arg=--no-backups)")
    parser.add_argument("--profile", type=Path, help="run the relay under cProfile, stats written here")
    parser.add_argument("--work-dir", type=Path, help="the session folder's parent (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/load.json"), help="figures as JSON")


@dataclass(frozen=True)
class LoadSettings:
    peers: int = 200
    watchers: int = 200
    minutes: float = 10.0
    k: int = 50
    chunks: int = 100
    rows: int = 64
    unit_seconds: float = 2.0
    anchor_units: int = 30
    tricklers: int = 5
    trickle_rate: int = 4
    silent: int = 20
    head_tricklers: int = 5
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    warm_up: float = 60.0
    serve_args: tuple[str, ...] = ()
    profile: Path | None = None

    @property
    def seconds(self) -> float:
        return self.minutes * 60

    @property
    def slow_window(self) -> tuple[float, float]:
        """When the slow clients run (seconds after the crowd starts): the middle third."""
        return self.seconds / 3, 2 * self.seconds / 3

    def passes(self) -> int:
        """Enough passes that the session outlasts the run: a round a second at most, and the anchor's."""
        rounds = int(self.seconds) + 2 * self.anchor_units + 10
        return math.ceil(rounds * self.k / self.chunks)


def settings_from_args(args: argparse.Namespace) -> LoadSettings:
    seconds = args.minutes * 60
    return LoadSettings(peers=args.peers, watchers=args.watchers, minutes=args.minutes,
                        k=args.participants or max(1, args.peers // 4), chunks=args.chunks, rows=args.rows,
                        unit_seconds=args.unit_seconds, anchor_units=args.anchor_units, tricklers=args.tricklers,
                        trickle_rate=args.trickle_rate, silent=args.silent, head_tricklers=args.head_tricklers,
                        body_timeout=args.body_timeout, header_timeout=args.header_timeout,
                        warm_up=args.warm_up if args.warm_up is not None else min(60.0, seconds / 5),
                        serve_args=tuple(args.serve_arg), profile=args.profile)


# ---------------------------------------------------------------- the relay under test


def serve_arguments(settings: LoadSettings, session_dir: Path) -> list[str]:
    task_settings = {"chunks": settings.chunks, "examples": settings.chunks * settings.rows, "epochs": 1}
    return ["--host", "127.0.0.1", "--port", "0", "--task", TASK,
            *[f"--set={key}={value}" for key, value in task_settings.items()],
            "--session-dir", str(session_dir), "--fresh", "-k", str(settings.k), "--passes", str(settings.passes()),
            "--admin-token", ADMIN, "--min-peers", "1",
            # every simulated peer joins from 127.0.0.1: no admission limit per address here
            "--join-rate", "0", "--max-peers-per-address", "0",
            "--body-timeout", str(settings.body_timeout), "--header-timeout", str(settings.header_timeout),
            *settings.serve_args]


@dataclass
class RelayProcess:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.url.removeprefix("http://").rstrip("/").rpartition(":")
        return host, int(port)


@contextmanager
def relay_process(arguments: list[str], log: Path, profile: Path | None = None) -> Iterator[RelayProcess]:
    """``peertrain serve`` in a child process (examples/ on its path), its output in ``log``; stopped after."""
    python = [sys.executable, "-m", "cProfile", "-o", str(profile)] if profile else [sys.executable]
    command = [*python, "-m", "server.cli", "serve", *arguments]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH"))
                                                      if p)}
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None:
            found = re.search(r"(http://\S+/)", log.read_text())
            if found:
                url = found.group(1)
            elif process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the relay did not print its URL (exit {process.poll()}): "
                                   f"{log.read_text()[-2000:]}")
            else:
                time.sleep(0.05)
        yield RelayProcess(process, url.rstrip("/"), log)
    finally:
        # uvicorn re-raises the signal it shut down on: SIGTERM's default action would lose cProfile's stats, a
        # KeyboardInterrupt lets cProfile write them on its way out.
        process.send_signal(signal.SIGINT if profile else signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def rss_mb(pid: int) -> float | None:
    """The resident set of process ``pid`` in MB (VmRSS), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far (``/proc/<pid>/stat``), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # (utime, stime: fields 14, 15)


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_share(samples: list[tuple[float, float, float]], since: float, until: float) -> tuple[float, float]:
    """Mean CPU use of (the relay, this bench) between ``since`` and ``until``, as a share of one core."""
    inside = [s for s in samples if since <= s[0] <= until]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan"), float("nan")
    wall = inside[-1][0] - inside[0][0]
    return (inside[-1][1] - inside[0][1]) / wall, (inside[-1][2] - inside[0][2]) / wall


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 2:
        return float("nan")
    t = np.array([s for s, _ in samples])
    y = np.array([mb for _, mb in samples])
    return float(np.polyfit(t, y, 1)[0] * 60)


# ---------------------------------------------------------------- what the bench records


@dataclass
class Recorder:
    """Every timed request (kind -> [(seconds since the crowd started, latency)]), every answer by status and
    code, and the units handed out."""

    started: float = field(default_factory=time.perf_counter)
    latencies: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    answers: Counter[str] = field(default_factory=Counter)  # "200", "409 stale_round", "transport ..."
    handed_out: set[tuple[int, int, int]] = field(default_factory=set)  # (round, slot, unit)
    held_polls: int = 0
    units_trained: int = 0
    units_uploaded: int = 0
    backups: int = 0
    trained_cache_hits: int = 0

    def now(self) -> float:
        return time.perf_counter() - self.started

    def answer(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            self.answers[str(response.status_code)] += 1
            return
        try:
            code = str(response.json().get("error", ""))
        except ValueError:
            code = response.text[:40].strip()
        self.answers[f"{response.status_code} {code}"] += 1

    def time(self, kind: str, started: float) -> None:
        self.latencies[kind].append((started - self.started, time.perf_counter() - started))


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    array = np.array(values)
    return {"n": len(values), "p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99)),
            "max": float(array.max())}


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{1e3 * value:.1f}"


# ---------------------------------------------------------------- simulated peers


class Trainer:
    """Trains each (round, unit) once with the runtime a browser runs and keeps the result: a backup of that unit
    trains the same unit from the same weights, which gives these bytes."""

    def __init__(self, task_info: dict[str, Any]) -> None:
        self.peer = Peer(task_info)
        self.results: dict[tuple[int, int], bytes] = {}

    def result(self, job: dict[str, Any], weights: bytes, unit: bytes, recorder: Recorder) -> bytes:
        key = (int(job["round"]), int(job["unit_index"]))
        if key in self.results:
            recorder.trained_cache_hits += 1
            return self.results[key]
        if self.peer.weights_round != job["weights_round"]:
            self.peer.set_weights(weights)
        body = self.peer.train(job, unit)
        recorder.units_trained += 1
        self.results = {k: v for k, v in self.results.items() if k[0] >= key[0] - 1}  # (older rounds are merged)
        self.results[key] = body
        return body


@dataclass
class Crowd:
    """What every simulated client shares."""

    client: httpx.AsyncClient
    trainer: Trainer
    recorder: Recorder
    settings: LoadSettings
    hold: float
    stop: asyncio.Event
    host: str
    port: int
    slow: asyncio.Event = field(default_factory=asyncio.Event)  # set while the slow clients run

    async def sleep(self, seconds: float) -> bool:
        """Sleep, or return early (False) when the run stops."""
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
        except TimeoutError:
            return True
        return False


async def request(crowd: Crowd, relay: AsyncRelayClient, method: str, path: str, kind: str | None = None,
                  **kwargs: Any) -> httpx.Response | None:
    """One request, timed under ``kind``; None after a transport error (counted)."""
    headers = relay.credentials.headers if relay.credentials else {}
    started = time.perf_counter()
    try:
        response = await crowd.client.request(method, path, headers=headers, **kwargs)
    except httpx.HTTPError as error:
        crowd.recorder.answers[f"transport {type(error).__name__}"] += 1
        return None
    if kind is not None:
        crowd.recorder.time(kind, started)
    crowd.recorder.answer(response)
    return response


async def join(crowd: Crowd) -> AsyncRelayClient | None:
    relay = AsyncRelayClient(crowd.client)
    for _ in range(10):
        response = await request(crowd, relay, "POST", "/api/join", "join", json={})
        if response is not None and response.status_code == 200:
            body = response.json()
            relay.credentials = Credentials(body["peer_id"], body["token"])
            return relay
        if not await crowd.sleep(1.0):
            return None
    return None


async def next_job(crowd: Crowd, relay: AsyncRelayClient, *, probe: bool = True) -> dict[str, Any] | None:
    """An assignment: first asked without hold (timed: answered at once), then held polls; None at the end."""
    if probe:
        response = await request(crowd, relay, "POST", "/api/work", "work")
        if response is not None and response.status_code == 200 and "slot" in response.json():
            return dict(response.json())
    while not crowd.stop.is_set():
        crowd.recorder.held_polls += 1
        response = await request(crowd, relay, "POST", f"/api/work?hold={crowd.hold:g}",
                                 timeout=crowd.hold + 30)
        if response is None or response.status_code != 200:
            if not await crowd.sleep(1.0):
                return None
            continue
        job = response.json()
        if "slot" in job:
            return dict(job)
        if job.get("done"):
            return None
        if job.get("wait") and not await crowd.sleep(float(job["wait"])):
            return None
    return None


async def fetch_and_train(crowd: Crowd, relay: AsyncRelayClient, job: dict[str, Any]) -> bytes | None:
    """The job's weights (downloaded when this peer lacks them) and unit, trained (or the cached result)."""
    recorder = crowd.recorder
    round_index = int(job["round"])
    recorder.handed_out.add((round_index, int(job["slot"]), int(job["unit_index"])))
    recorder.backups += job.get("copy") == "backup"
    weights_round = int(job["weights_round"])
    response = await request(crowd, relay, weights_call(weights_round).method, weights_call(weights_round).path,
                             "weights")
    if response is None or response.status_code != 200:
        return None
    weights = response.content
    response = await request(crowd, relay, "GET", unit_call(int(job["unit_index"])).path, "unit")
    if response is None or response.status_code != 200:
        return None
    return crowd.trainer.result(job, weights, response.content, recorder)


async def sim_peer(crowd: Crowd, index: int, *, anchor_units: int | None = None) -> None:
    """The page's worker loop; ``anchor_units``: the single-peer anchor (no compute time, that many units)."""
    rng = random.Random(index)
    relay = await join(crowd)
    if relay is None:
        return
    done = 0
    while not crowd.stop.is_set() and (anchor_units is None or done < anchor_units):
        job = await next_job(crowd, relay)
        if job is None:
            return
        body = await fetch_and_train(crowd, relay, job)
        if body is None:
            continue
        if anchor_units is None and not await crowd.sleep(crowd.settings.unit_seconds * rng.uniform(0.5, 1.5)):
            return
        call = result_call(job["round"], job["slot"], body)
        response = await request(crowd, relay, call.method, call.path, "result", content=body)
        crowd.recorder.units_uploaded += response is not None and response.status_code == 200
        done += 1


# ---------------------------------------------------------------- slow and silent clients (raw sockets)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, str]:
    """Status and error code of one HTTP/1.1 response (its body read by Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), 0)
    body = await reader.readexactly(length) if length else b""
    try:
        code = str(json.loads(body).get("error", "")) if body else ""
    except ValueError:
        code = ""
    return status, code


def settle(future: asyncio.Future[Any] | None) -> None:
    """Cancel ``future`` if still running, else take its exception (a reader of a connection we gave up on)."""
    if future is None:
        return
    if not future.done():
        future.cancel()
    elif not future.cancelled():
        future.exception()


async def trickle(crowd: Crowd, path: str, headers: dict[str, str], body: bytes) -> tuple[str, float, int]:
    """Upload ``body`` ``trickle_rate`` bytes a second until the relay answers: (answer, seconds, bytes sent)."""
    reader, writer = await asyncio.open_connection(crowd.host, crowd.port)
    started = time.perf_counter()
    sent = 0
    answer: asyncio.Future[tuple[int, str]] | None = None
    try:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(f"POST {path} HTTP/1.1\r\nhost: {crowd.host}\r\ncontent-type: application/octet-stream\r\n"
                     f"content-length: {len(body)}\r\n{head}\r\n".encode())
        answer = asyncio.ensure_future(read_response(reader))
        rate = max(1, crowd.settings.trickle_rate)
        limit = crowd.settings.body_timeout * 3 + 30
        while not answer.done() and time.perf_counter() - started < limit:
            if sent < len(body):
                writer.write(body[sent:sent + rate])
                sent += rate
            await asyncio.wait({answer}, timeout=1.0)
        if not answer.done():
            return "no answer", time.perf_counter() - started, sent
        status, code = answer.result()
        return f"{status} {code}".strip(), time.perf_counter() - started, min(sent, len(body))
    except (OSError, asyncio.IncompleteReadError) as error:
        return f"transport {type(error).__name__}", time.perf_counter() - started, sent
    finally:
        settle(answer)
        writer.close()


@dataclass
class SlowFigures:
    trickled: list[tuple[str, float, int]] = field(default_factory=list)  # (answer, seconds, bytes sent)
    trickled_units: set[tuple[int, int]] = field(default_factory=set)  # (round, unit) a trickler held
    silent_closed: list[float] = field(default_factory=list)  # seconds until the relay closed them
    heads: list[tuple[str, float]] = field(default_factory=list)


async def trickler(crowd: Crowd, index: int, figures: SlowFigures) -> None:
    """An honest peer on a very slow uplink: its units must be taken by backups, its uploads refused in time."""
    await crowd.slow.wait()
    relay = await join(crowd)
    if relay is None or relay.credentials is None:
        return
    while crowd.slow.is_set() and not crowd.stop.is_set():
        job = await next_job(crowd, relay, probe=False)
        if job is None:
            return
        body = await fetch_and_train(crowd, relay, job)
        if body is None:
            continue
        figures.trickled_units.add((int(job["round"]), int(job["unit_index"])))
        call = result_call(job["round"], job["slot"], body)
        figures.trickled.append(await trickle(crowd, call.path, relay.credentials.headers, body))


async def silent(crowd: Crowd, figures: SlowFigures) -> None:
    """Opens a connection and sends nothing, again and again: the relay must close each."""
    await crowd.slow.wait()
    while crowd.slow.is_set() and not crowd.stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(crowd.host, crowd.port)
        except OSError:
            await crowd.sleep(1.0)
            continue
        started = time.perf_counter()
        try:
            await asyncio.wait_for(reader.read(), timeout=crowd.settings.header_timeout * 3 + 30)
            figures.silent_closed.append(time.perf_counter() - started)
        except (TimeoutError, OSError):
            figures.silent_closed.append(float("inf"))
        finally:
            writer.close()


async def head_trickler(crowd: Crowd, figures: SlowFigures) -> None:
    """Sends a request head a byte a second: the relay must answer 408 header_timeout."""
    await crowd.slow.wait()
    head = b"POST /api/result?round=0&slot=0 HTTP/1.1\r\nhost: relay\r\ncontent-length: 10\r\nx-slow: " + b"." * 100
    while crowd.slow.is_set() and not crowd.stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(crowd.host, crowd.port)
        except OSError:
            await crowd.sleep(1.0)
            continue
        started = time.perf_counter()
        answer: asyncio.Future[tuple[int, str]] | None = None
        try:
            answer = asyncio.ensure_future(read_response(reader))
            for byte in range(len(head)):
                if answer.done():
                    break
                writer.write(head[byte:byte + 1])
                await asyncio.wait({answer}, timeout=1.0)
            status, code = await asyncio.wait_for(answer, timeout=crowd.settings.header_timeout + 30)
            figures.heads.append((f"{status} {code}", time.perf_counter() - started))
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as error:
            figures.heads.append((f"closed {type(error).__name__}", time.perf_counter() - started))
        finally:
            settle(answer)
            writer.close()


# ---------------------------------------------------------------- page watchers (raw event streams)


@dataclass
class WatcherFigures:
    events: int = 0
    bytes: int = 0
    keep_alives: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    seen: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))  # round -> first sight times
    sizes: dict[int, int] = field(default_factory=dict)  # round -> bytes of the first event that showed it


async def watcher(crowd: Crowd, figures: WatcherFigures) -> None:
    """``GET /api/events`` as an EventSource would hold it: every event read, the first sight of a round noted."""
    try:
        reader, writer = await asyncio.open_connection(crowd.host, crowd.port)
    except OSError as error:
        figures.failures[type(error).__name__] += 1
        return
    last_round = -1
    try:
        writer.write(f"GET /api/events HTTP/1.1\r\nhost: {crowd.host}\r\naccept: text/event-stream\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            figures.failures[head.split(b"\r\n", 1)[0].decode("latin-1")] += 1
            return
        buffer = b""
        while not crowd.stop.is_set():
            size_line = await reader.readline()
            if not size_line:
                figures.failures["closed by the relay"] += 1
                return
            size = int(size_line.strip() or b"0", 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                figures.failures["stream ended"] += 1
                return
            buffer += chunk[:-2]
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                figures.bytes += len(event)
                if event.startswith(b":"):
                    figures.keep_alives += 1
                    continue
                figures.events += 1
                found = ROUND_RE.search(event, 0, 4096)
                if found and int(found.group(1)) > last_round:
                    last_round = int(found.group(1))
                    figures.seen[last_round].append(crowd.recorder.now())
                    figures.sizes.setdefault(last_round, len(event))
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        if not crowd.stop.is_set():
            figures.failures[type(error).__name__] += 1
    finally:
        writer.close()


# ---------------------------------------------------------------- the run


@dataclass
class LoadFigures:
    settings: dict[str, Any]
    anchor: dict[str, dict[str, float]]  # kind -> percentiles, the single peer alone
    latency: dict[str, dict[str, float]]  # kind -> percentiles, the crowd (after warm-up)
    latency_slow: dict[str, dict[str, float]]  # while the slow clients ran
    latency_calm: dict[str, dict[str, float]]  # after warm-up, outside the slow clients' window
    rss: list[tuple[float, float]]  # (seconds since the crowd started, MB)
    cpu_relay: float  # the relay's mean CPU use after the warm-up, as a share of one core
    cpu_bench: float  # this bench's
    bench_lag: dict[str, float]  # how late the bench's loop woke a 0.1 s sleep (added to what it times)
    rss_per_round_mb: float  # RSS growth after the warm-up per round merged meanwhile
    rss_start: float
    rss_slope_mb_per_min: float
    rounds: int
    rounds_per_minute: float
    rounds_per_minute_slow: float
    rounds_per_minute_calm: float
    longest_round_slow: float
    longest_round_calm: float
    units_lost: int
    history_gaps: int
    history_missing: int
    handed_out: int
    refusals: dict[str, int]
    answers: dict[str, int]
    five_xx: int
    transport_errors: int
    held_polls: int
    units_trained: int
    trained_cache_hits: int
    units_uploaded: int
    backups: int
    watchers: dict[str, Any]
    slow: dict[str, Any]
    counters: dict[str, int]

    @property
    def rss_slope_share(self) -> float:
        return self.rss_slope_mb_per_min / self.rss_start if self.rss_start else float("nan")


def figures_of(recorder: Recorder, since: float, until: float = float("inf"),
               outside: tuple[float, float] | None = None) -> dict[str, dict[str, float]]:
    return {kind: percentiles([latency for at, latency in values if since <= at < until and (
        outside is None or not outside[0] <= at < outside[1])]) for kind, values in recorder.latencies.items()}


def round_times(history: list[dict[str, Any]], start_wall: float) -> list[tuple[int, float]]:
    """(round, seconds since the crowd started when it merged) from the history's wall-clock times."""
    return [(int(entry["round"]), float(entry["time"]) - start_wall) for entry in history]


def rounds_between(times: list[tuple[int, float]], since: float, until: float) -> float:
    merged = [at for _, at in times if since <= at < until]
    return len(merged) / ((until - since) / 60) if until > since else float("nan")


def longest_round(times: list[tuple[int, float]], since: float, until: float) -> float:
    gaps = [b - a for (_, a), (_, b) in zip(times, times[1:], strict=False) if since <= b < until]
    return max(gaps) if gaps else float("nan")


def lost_units(history: list[dict[str, Any]], handed_out: set[tuple[int, int, int]]) -> tuple[int, int, int]:
    """(units lost, gaps in the history's rounds, units the history says a round missed)."""
    rounds = [int(entry["round"]) for entry in history]
    gaps = sum(1 for expected, got in enumerate(rounds) if expected != got)
    missing = sum(len(entry.get("missing") or []) - len(entry.get("carried") or []) for entry in history)
    merged = {int(entry["round"]): set(entry["units"]) | set(entry.get("carried") or []) for entry in history}
    lost = sum(1 for round_index, _, unit in handed_out if round_index in merged and unit not in merged[round_index])
    return lost, gaps, missing


async def sample_rss(pid: int, recorder: Recorder, samples: list[tuple[float, float]],
                     cpu: list[tuple[float, float, float]], stop: asyncio.Event) -> None:
    """Every second: the relay's RSS, and the CPU time of the relay and of this bench."""
    while not stop.is_set():
        value, used = rss_mb(pid), cpu_seconds(pid)
        if value is not None and used is not None:
            samples.append((recorder.now(), value))
            cpu.append((recorder.now(), used, own_cpu_seconds()))
        try:
            await asyncio.wait_for(stop.wait(), timeout=RSS_SAMPLE_SECONDS)
        except TimeoutError:
            pass


async def measure_lag(lags: list[float], stop: asyncio.Event) -> None:
    """How late this bench's event loop wakes a 0.1 s sleep: what its own load adds to every latency it times."""
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(LAG_PROBE_SECONDS)
        lags.append(time.perf_counter() - started - LAG_PROBE_SECONDS)


async def progress(crowd: Crowd, rss: list[tuple[float, float]], cpu: list[tuple[float, float, float]],
                   watchers: WatcherFigures, slow: SlowFigures) -> None:
    recorder, last = crowd.recorder, 0.0
    while await crowd.sleep(PROGRESS_SECONDS):
        now = recorder.now()
        window = figures_of(recorder, last, now)
        status = (await crowd.client.get("/api/session")).json()
        five = sum(n for answer, n in recorder.answers.items() if answer[:1] == "5")
        errors = sum(n for answer, n in recorder.answers.items() if answer.startswith("transport"))
        relay_cpu, bench_cpu = cpu_share(cpu, last, now)
        print(f"  [{now:4.0f} s] round {status['round']}, RSS {rss[-1][1] if rss else float('nan'):.1f} MB, CPU "
              f"relay {relay_cpu:.0%} bench {bench_cpu:.0%}, "
              f"{sum(recorder.answers.values())} answers ({five} 5xx, {errors} transport errors); last "
              f"{now - last:.0f} s: work p50/p99 {ms(window.get('work', percentiles([]))['p50'])}/"
              f"{ms(window.get('work', percentiles([]))['p99'])} ms, result p50/p99 "
              f"{ms(window.get('result', percentiles([]))['p50'])}/{ms(window.get('result', percentiles([]))['p99'])}"
              f" ms; {watchers.events} events to watchers; slow clients "
              f"{'on' if crowd.slow.is_set() else 'off'} ({len(slow.trickled)} trickled uploads answered, "
              f"{len(slow.silent_closed)} silent connections closed)", flush=True)
        last = now


async def slow_window(crowd: Crowd) -> None:
    start, end = crowd.settings.slow_window
    if not await crowd.sleep(start):
        return
    crowd.slow.set()
    print(f"  [{crowd.recorder.now():4.0f} s] slow clients start", flush=True)
    await crowd.sleep(end - start)
    crowd.slow.clear()
    print(f"  [{crowd.recorder.now():4.0f} s] slow clients stop", flush=True)


async def drive(relay: RelayProcess, settings: LoadSettings) -> LoadFigures:
    host, port = relay.host_port
    connections = settings.peers + settings.tricklers + 20
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=relay.url, timeout=120, limits=limits) as client:
        task_info = (await client.get("/api/task")).json()
        hold = float(task_info["limits"]["hold_seconds"])
        recorder = Recorder()
        crowd = Crowd(client, Trainer(task_info), recorder, settings, hold, asyncio.Event(), host, port)

        # The anchor: one peer alone on the relay (``--min-peers 1``), no compute time.
        await sim_peer(crowd, -1, anchor_units=settings.anchor_units)
        anchor = figures_of(recorder, 0.0)
        print("  single peer alone: " + ", ".join(f"{kind} p50 {ms(f['p50'])} ms, p99 {ms(f['p99'])} ms"
                                                for kind, f in anchor.items() if kind != "join"), flush=True)

        recorder.started, recorder.latencies = time.perf_counter(), defaultdict(list)
        recorder.answers.clear()
        start_wall = time.time()
        rss: list[tuple[float, float]] = []
        cpu: list[tuple[float, float, float]] = []
        watchers, slow = WatcherFigures(), SlowFigures()
        sampler_stop = asyncio.Event()
        sampler = asyncio.create_task(sample_rss(relay.pid, recorder, rss, cpu, sampler_stop))
        lags: list[float] = []
        lag_probe = asyncio.create_task(measure_lag(lags, sampler_stop))
        tasks = [asyncio.create_task(watcher(crowd, watchers)) for _ in range(settings.watchers)]
        tasks += [asyncio.create_task(sim_peer(crowd, i)) for i in range(settings.peers)]
        tasks += [asyncio.create_task(trickler(crowd, i, slow)) for i in range(settings.tricklers)]
        tasks += [asyncio.create_task(silent(crowd, slow)) for _ in range(settings.silent)]
        tasks += [asyncio.create_task(head_trickler(crowd, slow)) for _ in range(settings.head_tricklers)]
        helpers = [asyncio.create_task(progress(crowd, rss, cpu, watchers, slow)),
                   asyncio.create_task(slow_window(crowd))]
        print(f"  crowd: {settings.peers} peers, {settings.watchers} watchers for {settings.minutes:g} min; slow "
              f"clients from {settings.slow_window[0]:.0f} s to {settings.slow_window[1]:.0f} s", flush=True)
        await crowd.sleep(settings.seconds)  # (returns at the deadline: nothing sets stop before)
        crowd.stop.set()
        crowd.slow.clear()
        ended = recorder.now()
        _, pending = await asyncio.wait(tasks + helpers, timeout=hold + STOP_GRACE_SECONDS)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        sampler_stop.set()
        await asyncio.gather(sampler, lag_probe)

        status = (await client.get("/api/session")).json()
        exported = await client.get("/api/admin/export/history", headers={"Authorization": f"Bearer {ADMIN}"})
        history = [json.loads(line) for line in exported.text.splitlines() if line.strip()]

    warm = settings.warm_up
    window = settings.slow_window
    times = round_times(history, start_wall)
    after_warm = [(t, mb) for t, mb in rss if t >= warm] or rss
    lost, gaps, missing = lost_units(history, recorder.handed_out)
    rounds_after_warm = len([t for _, t in times if warm <= t <= ended])
    seen_by_all = [times for times in watchers.seen.values() if len(times) >= 2]
    spreads = [max(times) - min(times) for times in seen_by_all]
    answers = dict(recorder.answers)
    counters = dict(status.get("counters", {}))
    merged_units = {int(entry["round"]): set(entry["units"]) for entry in history}
    trickled = [(r, u) for r, u in slow.trickled_units if r in merged_units]  # (a round still open at the end: not)
    trickled_merged = sum(1 for r, u in trickled if u in merged_units[r])
    return LoadFigures(
        settings=asdict(settings) | {"profile": str(settings.profile) if settings.profile else None},
        anchor=anchor, latency=figures_of(recorder, warm, ended),
        latency_slow=figures_of(recorder, window[0], window[1]),
        latency_calm=figures_of(recorder, warm, ended, outside=window),
        rss=rss, cpu_relay=cpu_share(cpu, warm, ended)[0], cpu_bench=cpu_share(cpu, warm, ended)[1],
        bench_lag=percentiles(lags),
        rss_per_round_mb=(after_warm[-1][1] - after_warm[0][1]) / max(1, rounds_after_warm) if after_warm
        else float("nan"),
        rss_start=after_warm[0][1] if after_warm else float("nan"),
        rss_slope_mb_per_min=slope_per_minute(after_warm),
        rounds=len([t for _, t in times if 0 <= t <= ended]),
        rounds_per_minute=rounds_between(times, 0.0, ended),
        rounds_per_minute_slow=rounds_between(times, *window),
        rounds_per_minute_calm=(len([t for _, t in times if warm <= t < ended and not window[0] <= t < window[1]])
                                / max(1e-9, (ended - warm - (window[1] - window[0])) / 60)),
        longest_round_slow=longest_round(times, *window),
        longest_round_calm=max(longest_round(times, warm, window[0]), longest_round(times, window[1], ended)),
        units_lost=lost, history_gaps=gaps, history_missing=missing, handed_out=len(recorder.handed_out),
        refusals={name.removeprefix("refused."): n for name, n in counters.items() if name.startswith("refused.")},
        answers=answers, five_xx=sum(n for a, n in answers.items() if a[:1] == "5"),
        transport_errors=sum(n for a, n in answers.items() if a.startswith("transport")),
        held_polls=recorder.held_polls, units_trained=recorder.units_trained,
        trained_cache_hits=recorder.trained_cache_hits, units_uploaded=recorder.units_uploaded,
        backups=recorder.backups,
        watchers={"events": watchers.events, "bytes": watchers.bytes, "keep_alives": watchers.keep_alives,
                  "failures": dict(watchers.failures), "rounds_seen": len(watchers.seen),
                  "event_bytes": sorted(watchers.sizes.items()),
                  "spread": percentiles(spreads)},
        slow={"trickled": dict(Counter(answer for answer, _, _ in slow.trickled)),
              "trickle_seconds": percentiles([s for _, s, _ in slow.trickled]),
              "trickled_bytes": sum(sent for _, _, sent in slow.trickled),
              "trickled_units": len(trickled), "trickled_units_merged": trickled_merged,
              "silent_closed": percentiles([s for s in slow.silent_closed if math.isfinite(s)]),
              "silent_never_closed": sum(1 for s in slow.silent_closed if not math.isfinite(s)),
              "heads": dict(Counter(answer for answer, _ in slow.heads)),
              "head_seconds": percentiles([s for _, s in slow.heads])},
        counters=counters)


def report(f: LoadFigures, settings: LoadSettings) -> list[str]:
    """The figures, each beside its anchor."""
    lines = []
    slope, share = f.rss_slope_mb_per_min, f.rss_slope_share
    rss_values = [mb for _, mb in f.rss]
    lines.append(f"relay memory (VmRSS, {len(f.rss)} samples): {f.rss_start:.1f} MB at {settings.warm_up:.0f} s "
                 f"(after the warm-up), {rss_values[-1] if rss_values else float('nan'):.1f} MB at the end, max "
                 f"{max(rss_values, default=float('nan')):.1f} MB; slope after the warm-up {slope:+.3f} MB/min = "
                 f"{share:+.2%} of that RSS per minute")
    lines.append(f"  = {f.rss_per_round_mb * 1e3:+.0f} kB per round merged after the warm-up")
    lines.append(f"CPU after the warm-up: the relay {f.cpu_relay:.0%} of one core, this bench {f.cpu_bench:.0%} "
                 f"(of {os.cpu_count()} cores); the bench's own loop woke a 0.1 s sleep {ms(f.bench_lag['p50'])} ms "
                 f"(p50) / {ms(f.bench_lag['p99'])} ms (p99) late, which every latency below includes")
    lines.append("latency (ms)          crowd p50 / p99 / max (n)        single peer p50 / p99   "
                 "slow clients on p50 / p99   off p50 / p99")
    for kind in ("work", "result", "weights", "unit", "join"):
        crowd = f.latency.get(kind, percentiles([]))
        alone = f.anchor.get(kind, percentiles([]))
        on, off = f.latency_slow.get(kind, percentiles([])), f.latency_calm.get(kind, percentiles([]))
        lines.append(f"  {kind:8s}  {ms(crowd['p50']):>8s} / {ms(crowd['p99']):>7s} / {ms(crowd['max']):>7s} "
                     f"({crowd['n']:>6d})   {ms(alone['p50']):>8s} / {ms(alone['p99']):>7s}    "
                     f"{ms(on['p50']):>8s} / {ms(on['p99']):>7s}      {ms(off['p50']):>7s} / {ms(off['p99']):>7s}")
    bound = 60 / settings.unit_seconds
    lines.append(f"rounds: {f.rounds} in {settings.minutes:g} min = {f.rounds_per_minute:.1f}/min (k = {settings.k}; "
                 f"a round lasts at least about one unit time, {settings.unit_seconds:g} s: at most ~{bound:.0f}/min); "
                 f"{f.rounds_per_minute_slow:.1f}/min with slow clients, {f.rounds_per_minute_calm:.1f}/min without; "
                 f"longest round {f.longest_round_slow:.1f} s with them, {f.longest_round_calm:.1f} s without "
                 f"(body timeout {settings.body_timeout:g} s)")
    lines.append(f"units lost: {f.units_lost} of {f.handed_out} handed out (history: {f.history_gaps} gaps, "
                 f"{f.history_missing} units missing); {f.units_uploaded} results accepted, {f.backups} backups "
                 f"handed out, {f.units_trained} units trained ({f.trained_cache_hits} results reused by a backup "
                 f"of the same unit), {f.held_polls} held polls")
    lines.append("refusals by code (the relay's counters): " + (", ".join(
        f"{code} {n}" for code, n in sorted(f.refusals.items())) or "none"))
    lines.append("answers the crowd got: " + ", ".join(f"{a} {n}" for a, n in sorted(f.answers.items()))
                 + f"; 5xx: {f.five_xx}, transport errors: {f.transport_errors}")
    w = f.watchers
    lines.append(f"watchers: {settings.watchers} streams read {w['events']} events ({w['bytes'] / 1e6:.1f} MB, "
                 f"{w['keep_alives']} keep-alives), {w['rounds_seen']} rounds seen; the last watcher saw a new round "
                 f"{ms(w['spread']['p50'])} ms (p50) / {ms(w['spread']['p99'])} ms (p99) after the first; failures "
                 f"{w['failures'] or 'none'}")
    if w["event_bytes"]:
        (first_round, first_size), (last_round, last_size) = w["event_bytes"][0], w["event_bytes"][-1]
        lines.append(f"  one event (the session status) was {first_size / 1e3:.1f} kB at round {first_round} and "
                     f"{last_size / 1e3:.1f} kB at round {last_round}")
    s = f.slow
    lines.append(f"tricklers ({settings.tricklers}, {settings.trickle_rate} B/s): {dict(s['trickled'])} after "
                 f"{s['trickle_seconds']['p50']:.1f} s (p50) / {s['trickle_seconds']['max']:.1f} s (max) "
                 f"against --body-timeout {settings.body_timeout:g} s; {s['trickled_units_merged']} of their "
                 f"{s['trickled_units']} units in merged rounds merged from another peer's result")
    lines.append(f"silent connections ({settings.silent}): {s['silent_closed']['n']} closed by the relay after "
                 f"{s['silent_closed']['p50']:.1f} s (p50) / {s['silent_closed']['max']:.1f} s (max), "
                 f"{s['silent_never_closed']} never; head tricklers ({settings.head_tricklers}): {dict(s['heads'])} "
                 f"after {s['head_seconds']['p50']:.1f} s (p50) against --header-timeout {settings.header_timeout:g} s")
    return lines


def run_load(settings: LoadSettings, work: Path) -> LoadFigures:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # the trainer imports the task as the relay does
    arguments = serve_arguments(settings, work / "session")
    with relay_process(arguments, work / "serve.log", settings.profile) as relay:
        print(f"relay at {relay.url} (pid {relay.pid}): {TASK}, {settings.chunks} units of {settings.rows} rows, "
              f"k = {settings.k}, {settings.passes()} passes; log {relay.log}", flush=True)
        return asyncio.run(drive(relay, settings))


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="peertrain-bench-load-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        figures = run_load(settings, work)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print()
    for line in report(figures, settings):
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(figures), indent=1, default=str))
    print(f"figures: {args.out}")
    failed = figures.units_lost or figures.history_gaps or figures.history_missing or figures.five_xx
    if failed:
        print("FAILED: units lost, a gap in the history or a 5xx answer (see above)")
    return 1 if failed else 0


__all__ = ["LoadFigures", "LoadSettings", "add_arguments", "run", "run_load"]
