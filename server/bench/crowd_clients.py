"""The crowd of ``peertrain bench crowd`` (``server.bench.crowd``): its peers, what they upload, and a slice of them in
a process of its own.

One process of HTTP clients cannot drive ten thousand peers on two cores: its event loop falls so far behind that
the relay's keep-alive closes the pooled connections it reuses late. ``--client-processes P`` spreads the crowd over
P processes: the bench's own runs the first slice (and watches the relay), each other one is ``python -m
server.bench.crowd_clients`` with its slice's peers, lies and loopback addresses, runs until it is sent SIGTERM, and
writes what its peers saw (a ``Timeline``: its clock, ``time.perf_counter``, is the machine's monotonic clock, the
same in every process) with their peer ids and its CPU seconds to a JSON file the bench merges.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from runtime import codecs, wire
from runtime.codecs import Codec
from runtime.protocol import Done, Job, Receipt, Wait
from server.bench.crowd_figures import LIES, Lie, Timeline
from server.bench.relay import RESEND
from server.harness.peer import AsyncTransport, Refused, RelayPeer, Result, WeightsFrom, pooled, run_async
from server.session.package import Package

HOLD_SECONDS = 15.0
BASES = 8  # distinct precomputed updates; a unit's index picks one
ENGINE = "crowd-bench"  # the engine the crowd's results name: one engine, so two copies of a unit must be identical


class Updates:
    """The crowd's precomputed honest updates, each encoded once in the codec the jobs name."""

    def __init__(self, package: Package, std: float) -> None:
        rng = np.random.default_rng(0)
        self.spec, self.fingerprint, self.initial = package.spec, package.fingerprint, package.initial_weights
        self.steps = [(rng.standard_normal(package.spec.size) * std).astype(np.float32) for _ in range(BASES)]
        self.steps += [-step for step in self.steps]  # (the flipped lies)
        self.payloads: dict[tuple[str, int, int], tuple[Codec, bytes]] = {}  # (codec, update, liar): encoded

    def message(self, job: Job, lie: Lie | None = None) -> bytes:
        """The unit's honest update, or a lie that passes every check of its size: ``free_rider`` (another unit's
        update, as if trained) or ``flip`` (the honest update negated), scaled by 1 + ``lie.own`` / 1000."""
        header = wire.WireHeader(spec=self.spec, round=job.round, fingerprint=self.fingerprint, num_examples=1,
                                 metrics={"train_loss": 1.0}, meta={"engine": ENGINE})
        kind, own = (None, 0) if lie is None else (lie.kind, lie.own)
        index = (job.unit_index + (1 if kind == "free_rider" else 0)) % BASES + (BASES if kind == "flip" else 0)
        step = self.steps[index] if not own else (self.steps[index] * np.float32(1 + own / 1000))
        if job.codec is None:  # (float32 weights: the initial ones moved; the relay checks their norm, no replay)
            return wire.encode(self.initial + step, header)
        key = json.dumps(job.codec, sort_keys=True)
        if (key, index, own) not in self.payloads:
            codec = codecs.from_json(job.codec)
            self.payloads[key, index, own] = codec, codec.encode(step, 0)
        codec, payload = self.payloads[key, index, own]
        assert job.weights_digest is not None
        return wire.encode_update(payload, header, codec, job.weights_digest[:16])  # (weights_digest)


async def crowd_peer(peer: RelayPeer, transport: AsyncTransport, updates: Updates, timeline: Timeline,
                     stop: asyncio.Event, lie: Lie | None = None, unit_seconds: float = 0.0) -> None:
    """Join, then ask, upload (``lie``: every result a lie of that kind; ``unit_seconds`` after the job came) and ask
    again until ``stop``, the session's end or a ban."""
    joined = await transport.run(peer.sign_in())
    if isinstance(joined, Refused):
        timeline.errors.append(f"join refused: {joined.status} {joined.code}")
        return
    hold: float | None = HOLD_SECONDS
    while not stop.is_set():
        asked, timed = time.perf_counter(), hold is None
        answer = await transport.run(peer.ask(hold))
        if timed:
            timeline.work_seconds.append(time.perf_counter() - asked)
        hold = HOLD_SECONDS
        if isinstance(answer, Refused):
            timeline.refusals[answer.code] = timeline.refusals.get(answer.code, 0) + 1
            if answer.code == "banned":
                return
            await asyncio.sleep(1.0)
            continue
        if isinstance(answer, Done):
            return
        if isinstance(answer, Wait):
            if not timed:  # (the timed ask's wait is not slept: the next ask holds, as a page's every ask does)
                await transport.run(peer.wait(answer))  # (as the relay says, capped: then ask again)
            continue
        job = answer
        timeline.jobs.append((job.round, job.unit_index, time.perf_counter()))
        body = updates.message(job, lie)
        if unit_seconds > 0:  # (as if training: woken by the stop, which ends the pause and the loop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), unit_seconds)
            if stop.is_set():
                return
        sent = time.perf_counter()
        receipt = await transport.run(peer.upload(job, Result(body, honest=False)))
        if isinstance(receipt, Refused):
            timeline.refusals[receipt.code] = timeline.refusals.get(receipt.code, 0) + 1
        elif isinstance(receipt, Receipt):
            timeline.results.append((job.round, job.unit_index, sent, time.perf_counter()))
            timeline.accepted.append((peer.peer_id, job.round, job.slot))
        hold = None  # (the next ask is answered at once: timed)


def lie_plan(peers: int, share: float, *, colluding: bool = False) -> list[Lie | None]:
    """Which peers lie, and how: every (1 / share)-th peer, the kinds in turn, each liar's lie its own unless
    ``colluding``."""
    liars = round(peers * share)
    every = peers / liars if liars else 0
    plan: list[Lie | None] = [None] * peers
    for n in range(liars):
        plan[int(n * every)] = Lie(LIES[n % len(LIES)], 0 if colluding else n + 1)
    return plan


@dataclass(frozen=True)
class Slice:
    """Peers ``first`` to ``first + len(lies) - 1`` of the crowd, each with its lie (None: honest), on clients bound
    to the loopback addresses 127.0.0.``addresses`` (one client an address, the relays' ``urls`` in turn)."""

    first: int
    lies: list[Lie | None]
    addresses: range

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "lies": [None if lie is None else [lie.kind, lie.own] for lie in self.lies],
                "addresses": [self.addresses.start, self.addresses.stop]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Slice:
        return cls(int(data["first"]), [None if lie is None else Lie(str(lie[0]), int(lie[1])) for lie in data["lies"]],
                   range(*data["addresses"]))


def slices(peers: int, addresses: int, lies: list[Lie | None], processes: int) -> list[Slice]:
    """The crowd cut into ``processes`` slices of consecutive peers (the liars spread through it stay spread), each
    with its share of the ``addresses`` (127.0.0.2 on; at least one)."""
    cuts = [round(peers * p / processes) for p in range(processes + 1)]
    spans = [round(addresses * p / processes) for p in range(processes + 1)]
    return [Slice(cuts[p], lies[cuts[p]:cuts[p + 1]], range(2 + spans[p], 2 + max(spans[p + 1], spans[p] + 1)))
            for p in range(processes)]


class CrowdSlice:
    """A slice's clients and peers on the running event loop, from ``start`` until ``close``."""

    def __init__(self, urls: list[str], updates: Updates, part: Slice, timeline: Timeline, stop: asyncio.Event, *,
                 unit_seconds: float) -> None:
        self.part, self.timeline, self.stop = part, timeline, stop
        addresses = len(part.addresses)
        limits, tls = pooled(-(-len(part.lies) // addresses) + 2), httpx.create_ssl_context()  # (one TLS context:
        #   each costs 50 ms of CPU to make)
        self.clients = [httpx.AsyncClient(base_url=urls[a % len(urls)], timeout=120, limits=limits,
                                          transport=httpx.AsyncHTTPTransport(verify=tls, local_address=f"127.0.0.{a}",
                                                                             limits=limits))
                        for a in part.addresses]
        self.peers = [RelayPeer(weights_from=WeightsFrom.CURRENT, wait_cap_s=HOLD_SECONDS, retry=RESEND)
                      for _ in part.lies]
        self.tasks = [asyncio.create_task(crowd_peer(peer, AsyncTransport(self.clients[i % addresses], stop),
                                                     updates, timeline, stop, part.lies[i], unit_seconds))
                      for i, peer in enumerate(self.peers)]

    def lies_by_peer(self) -> dict[str | None, Lie | None]:
        return {peer.peer_id: self.part.lies[i] for i, peer in enumerate(self.peers)}

    async def finish(self) -> None:
        """Stop the peers: each ends its loop at its next step (a held ask within ``HOLD_SECONDS``)."""
        self.stop.set()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=HOLD_SECONDS + 30)

    async def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for client in self.clients:
            await client.aclose()


async def run_slice(args: argparse.Namespace) -> dict[str, Any]:
    """A slice in this process until SIGTERM (or SIGINT): what its peers saw, their ids and lies, its CPU."""
    part = Slice.from_json(json.loads(Path(args.slice).read_text()))
    updates = Updates(Package.load(Path(args.package)), args.perturbation)
    timeline, stop, ended = Timeline(), asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, ended.set)
    started = time.process_time()
    crowd = CrowdSlice(args.urls.split(","), updates, part, timeline, stop, unit_seconds=args.unit_seconds)
    try:
        print(f"slice of {len(part.lies)} peers from peer {part.first} running", flush=True)
        await ended.wait()
        await crowd.finish()
    finally:
        await crowd.close()
    lies = crowd.lies_by_peer()
    return {"timeline": asdict(timeline), "peers": [[peer, None if lie is None else [lie.kind, lie.own]]
                                                    for peer, lie in lies.items()],
            "cpu_seconds": time.process_time() - started}


def merge_slice(timeline: Timeline, lies: dict[str | None, Lie | None], report: dict[str, Any]) -> float:
    """A slice's report (``run_slice``) into the bench's ``timeline`` and ``lies``; returns its CPU seconds."""
    theirs = report["timeline"]
    timeline.jobs += [tuple(row) for row in theirs["jobs"]]  # type: ignore[misc]
    timeline.results += [tuple(row) for row in theirs["results"]]  # type: ignore[misc]
    timeline.accepted += [tuple(row) for row in theirs["accepted"]]  # type: ignore[misc]
    timeline.work_seconds += theirs["work_seconds"]
    timeline.errors += theirs["errors"]
    for code, count in theirs["refusals"].items():
        timeline.refusals[code] = timeline.refusals.get(code, 0) + int(count)
    for peer, lie in report["peers"]:
        lies[peer] = None if lie is None else Lie(str(lie[0]), int(lie[1]))
    return float(report["cpu_seconds"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.bench.crowd_clients",
                                     description="a slice of peertrain bench crowd's crowd, until SIGTERM")
    parser.add_argument("--urls", required=True, help="the relays, comma-separated")
    parser.add_argument("--package", required=True, help="the session's package folder")
    parser.add_argument("--slice", required=True, help="a JSON file: the slice (Slice.to_json)")
    parser.add_argument("--perturbation", type=float, required=True, help="std of the precomputed updates")
    parser.add_argument("--unit-seconds", type=float, default=0.0, help="seconds before each upload")
    parser.add_argument("--out", required=True, help="where the report goes (JSON)")
    args = parser.parse_args(argv)
    report = run_async(lambda: run_slice(args))  # (the main thread here: its signal handlers need it)
    Path(args.out).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
