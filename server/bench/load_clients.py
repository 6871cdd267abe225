"""``peertrain bench load``'s clients, all on one asyncio loop: simulated peers, slow and silent clients, page watchers.

``sim_peer`` does what the page's worker does: the one Python peer (``server.harness.peer.RelayPeer``) stepped on
the crowd's shared pool (``Crowd.transport``), with a timer for its compute; the slow clients' uploads and the
watchers speak raw HTTP/1.1 over asyncio streams (a trickle or a half-sent head cannot be made with httpx, and
200 event streams are cheaper read as bytes). Everything timed goes to the ``Recorder``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from runtime.protocol import Done, Job
from server.harness.peer import (
    AsyncTransport,
    Exchange,
    PeerHooks,
    Refused,
    RelayPeer,
    Result,
    Retention,
    RetryPolicy,
    Trainer,
    Unanswered,
    WeightsFrom,
)
from server.relay.client import Call, result_call
from server.relay.options import DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT

LAG_PROBE_SECONDS = 0.1
ROUND_RE = re.compile(rb'"round": (\d+), "num_rounds"')  # the session's round, first in the status
KINDS = (("/api/join", "join"), ("/api/weights", "weights"), ("/api/unit/", "unit"), ("/api/result", "result"))
RETRY = RetryPolicy(resend=1_000_000, retry_5xx=False, first_delay_s=1.0, max_delay_s=1.0)  # until the run stops
JOIN_TRIES = 10
KEEP = Retention(rounds=2)  # a backup copies a unit of the open round (or the one just merged): older ones go


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

    def exchange(self, exchange: Exchange) -> None:
        """A simulated peer's request (``PeerHooks.on_exchange``): its answer, timed under its kind (``kind_of``)."""
        if exchange.response is None:
            self.answers[f"transport {type(exchange.error).__name__}"] += 1
            return
        kind = kind_of(exchange.call)
        if kind is not None:
            self.latencies[kind].append((exchange.started - self.started, exchange.seconds))
        self.answer(exchange.response)


def kind_of(call: Call) -> str | None:
    """Which latency a peer's request is timed under; a held poll is not timed (it waits for a round by design)."""
    if call.path.startswith("/api/work"):
        return "work" if call.path == "/api/work" else None
    return next((kind for prefix, kind in KINDS if call.path.startswith(prefix)), None)


# ---------------------------------------------------------------- simulated peers


@dataclass
class Crowd:
    """What every simulated client shares: one connection pool (``transport``), one ``trainer``, the ``recorder``."""

    client: httpx.AsyncClient
    trainer: Trainer  # trains each unit once from its weights: a backup of that unit gets these bytes
    recorder: Recorder
    settings: LoadSettings
    hold: float
    stop: asyncio.Event
    host: str
    port: int
    slow: asyncio.Event = field(default_factory=asyncio.Event)  # set while the slow clients run
    transport: AsyncTransport = field(init=False)

    def __post_init__(self) -> None:
        self.transport = AsyncTransport(self.client, self.stop)

    def peer(self) -> RelayPeer:
        """A simulated page's peer: the weights of every unit downloaded (``GET /api/weights?round=V``: each unit costs
        the relay a download), a request that got no answer sent again a second later until the run stops."""
        return RelayPeer(hooks=PeerHooks(on_exchange=self.recorder.exchange, stop=self.stop.is_set), retry=RETRY,
                         trainer=self.trainer, weights_from=WeightsFrom.ROUND, reuse_weights=False,
                         wait_cap_s=math.inf, join_tries=JOIN_TRIES)

    async def sleep(self, seconds: float) -> bool:
        """Sleep, or return early (False) when the run stops."""
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
        except TimeoutError:
            return True
        return False


async def next_job(crowd: Crowd, peer: RelayPeer, *, probe: bool = True) -> Job | None:
    """An assignment: first asked without hold (timed: answered at once), then held polls; None at the end."""
    run = crowd.transport.run
    if probe:
        answer = await run(peer.ask())
        if isinstance(answer, Job):
            return answer
    while not crowd.stop.is_set():
        crowd.recorder.held_polls += 1
        answer = await run(peer.ask(crowd.hold))
        if isinstance(answer, Job):
            return answer
        if isinstance(answer, Done):
            return None
        if isinstance(answer, Refused):
            if not await crowd.sleep(1.0):
                return None
            continue
        if answer.wait and not await crowd.sleep(answer.wait):
            return None
    return None


async def fetch_and_train(crowd: Crowd, peer: RelayPeer, job: Job) -> Result | None:
    """The job's weights and unit, trained on the crowd's trainer (or its kept result); None when either is refused."""
    recorder = crowd.recorder
    recorder.handed_out.add((job.round, job.slot, job.unit_index))
    recorder.backups += job.copy == "backup"
    fetched = await crowd.transport.run(peer.fetch(job))
    if isinstance(fetched, Refused):
        return None
    reused = crowd.trainer.reused
    result = peer.train(job, fetched)
    recorder.trained_cache_hits += crowd.trainer.reused - reused
    recorder.units_trained += crowd.trainer.reused == reused
    return result


async def sim_peer(crowd: Crowd, index: int, *, anchor_units: int | None = None) -> None:
    """The page's worker loop; ``anchor_units``: the single-peer anchor (no compute time, that many units)."""
    rng = random.Random(index)
    peer = crowd.peer()
    try:
        if isinstance(await crowd.transport.run(peer.sign_in()), Refused):
            return
        done = 0
        while not crowd.stop.is_set() and (anchor_units is None or done < anchor_units):
            job = await next_job(crowd, peer)
            if job is None:
                return
            result = await fetch_and_train(crowd, peer, job)
            if result is None:
                continue
            if anchor_units is None and not await crowd.sleep(crowd.settings.unit_seconds * rng.uniform(0.5, 1.5)):
                return
            receipt = await crowd.transport.run(peer.upload(job, result))
            crowd.recorder.units_uploaded += not isinstance(receipt, Refused)
            done += 1
    except Unanswered:  # (the run stopped while a request waited to be sent again)
        return


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
    peer = crowd.peer()
    try:
        if isinstance(await crowd.transport.run(peer.sign_in()), Refused):
            return
        while crowd.slow.is_set() and not crowd.stop.is_set():
            job = await next_job(crowd, peer, probe=False)
            if job is None or peer.credentials is None:
                return
            result = await fetch_and_train(crowd, peer, job)
            if result is None:
                continue
            figures.trickled_units.add((job.round, job.unit_index))
            # (its upload a trickle over a raw socket: httpx cannot send a body that slowly)
            call = result_call(job.round, job.slot, result.body)
            figures.trickled.append(await trickle(crowd, call.path, peer.credentials.headers, result.body))
    except Unanswered:
        return


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


async def measure_lag(lags: list[float], stop: asyncio.Event) -> None:
    """How late this bench's event loop wakes a 0.1 s sleep: what its own load adds to every latency it times."""
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(LAG_PROBE_SECONDS)
        lags.append(time.perf_counter() - started - LAG_PROBE_SECONDS)
