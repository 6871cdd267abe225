"""``peertrain bench capacity``: what a weights download and an event-stream watcher cost the relay's CPU, for the
capacity model in docs/sessions/public.md, beside the per-result and per-check figures ``bench crowd``
and ``bench relay`` measure.

A real ``peertrain serve`` on a bytetext package (its default model: the weights a crowd downloads each round), no
peer training. The relay's CPU seconds (``/proc``) are read around each phase, less its idle rate over the same
time (the anchor, measured first in the same run):
- **downloads**: ``--downloads`` fetches of the round's weights by digest (``GET /api/weights/{digest}``, what every
  peer does once a round) straight from the relay. Behind nginx's cache (``deploy/nginx.conf``) only the first
  fetch of each digest reaches the relay (tests/browser/test_nginx_browser.py sees the hits), so a round's
  downloads cost the relay one answer per nginx, whatever the crowd;
- **watchers**: ``--watchers`` pages' event streams (``GET /api/events``) open while the session's status changes
  ``--changes`` times (admin pause and resume), each change waited for until every watcher has it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from server.harness.peer import run_async
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.options import RelayOptions
from server.session.config import SessionConfig
from server.session.package import build_package

ADMIN = "capacity-admin"
IDLE_SECONDS = 5.0  # the relay's idle CPU rate, measured over this long
CHANGE_SECONDS = 30.0  # a bound on each status change reaching every watcher


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--downloads", type=int, default=200, help="weights fetches per way (default 200)")
    parser.add_argument("--watchers", type=int, default=100, help="event streams open at once (default 100)")
    parser.add_argument("--changes", type=int, default=20, help="status changes they all receive (default 20)")
    parser.add_argument("--chunks", type=int, default=8, help="the bytetext package's units (default 8)")
    parser.add_argument("--work-dir", type=Path, help="package and session (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/capacity.json"), help="figures as JSON")


class Meter:
    """The relay's CPU seconds over a phase, less its idle rate over the phase's time."""

    def __init__(self, relay: RelayProcess, idle_rate: float = 0.0) -> None:
        self.relay, self.idle_rate = relay, idle_rate

    def __enter__(self) -> Meter:
        self.cpu, self.started = self.relay.cpu_seconds(), time.monotonic()
        return self

    def __exit__(self, *_: object) -> None:
        self.seconds = time.monotonic() - self.started
        self.used = max(0.0, self.relay.cpu_seconds() - self.cpu - self.idle_rate * self.seconds)


def downloads(url: str, path: str, count: int, verify: Any = True) -> int:
    """``count`` fetches of ``path``, one connection kept; the bytes of one answer."""
    size = 0
    with httpx.Client(base_url=url, verify=verify, timeout=60) as client:
        for _ in range(count):
            answer = client.get(path)
            answer.raise_for_status()
            size = len(answer.content)
    return size


async def watch(url: str, watchers: int, changes: int, admin: dict[str, str]) -> int:
    """``watchers`` event streams open while the status changes ``changes`` times (pause, resume, ...), each change
    waited for until every stream has an event after it; the events read in all."""
    counts = [0] * watchers
    seen = asyncio.Condition()
    opened = asyncio.Event()

    async def stream(client: httpx.AsyncClient, index: int) -> None:
        async with client.stream("GET", "/api/events") as answer:
            async for line in answer.aiter_lines():
                if line.startswith("data:"):
                    async with seen:
                        counts[index] += 1
                        seen.notify_all()
                    if all(counts):
                        opened.set()

    limits = httpx.Limits(max_connections=watchers + 4, max_keepalive_connections=watchers + 4)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        tasks = [asyncio.create_task(stream(client, i)) for i in range(watchers)]
        try:
            await asyncio.wait_for(opened.wait(), CHANGE_SECONDS)  # (each stream sends the status it opens with)
            for change in range(changes):
                before = list(counts)

                def everyone_has_it(before: list[int] = before) -> bool:
                    return all(c > b for c, b in zip(counts, before, strict=True))

                answer = await client.post(f"/api/admin/{'pause' if change % 2 == 0 else 'resume'}", headers=admin)
                answer.raise_for_status()
                async with seen:
                    await asyncio.wait_for(seen.wait_for(everyone_has_it), CHANGE_SECONDS)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return sum(counts)


def run(args: argparse.Namespace) -> int:
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="peertrain-bench-capacity-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"building a bytetext package of {args.chunks} units", flush=True)
    package = build_package("bytetext", {"chunks": args.chunks}, work / "package", check=False, log=lambda _: None)
    serve = ServeCommand(package=package.path, session_dir=work / "session", fresh=True,
                         config=SessionConfig(participants=2, passes=1),
                         options=RelayOptions(admin_token=ADMIN, verify=False, forwarded_allow_ips="127.0.0.1"))
    figures: dict[str, Any] = {"watchers": args.watchers, "changes": args.changes, "downloads": args.downloads}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with RelayProcess(serve, log=work / "serve.log") as relay:
        client = relay.client()
        client.join()
        job = client.work()
        path = f"/api/weights/{job['weights_digest']}"
        with Meter(relay) as idle:
            time.sleep(IDLE_SECONDS)
        rate = idle.used / idle.seconds
        figures["idle_cpu_share"] = rate
        print(f"anchor: the relay idle uses {rate * 100:.2f} % of a core", flush=True)

        with Meter(relay, rate) as direct:
            size = downloads(relay.url, path, args.downloads)
        figures |= {"weights_bytes": size, "download_cpu_ms": 1000 * direct.used / args.downloads}
        print(f"downloads: {args.downloads} fetches of {size / 1e6:.2f} MB from the relay: "
              f"{figures['download_cpu_ms']:.2f} ms of relay CPU each", flush=True)
        print(f"watchers: {args.watchers} event streams, {args.changes} status changes", flush=True)
        with Meter(relay, rate) as watching:
            events = run_async(lambda: watch(relay.url, args.watchers, args.changes, admin))
        figures |= {"events": events, "event_cpu_ms": 1000 * watching.used / max(events, 1),
                    "watcher_change_cpu_ms": 1000 * watching.used / (args.watchers * args.changes)}
        print(f"watchers: {events} events sent, {figures['event_cpu_ms']:.3f} ms of relay CPU per event "
              f"({figures['watcher_change_cpu_ms']:.3f} ms per watcher per status change)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"figures written to {args.out}", flush=True)
    return 0
