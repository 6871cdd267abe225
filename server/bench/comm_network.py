"""``peertrain bench comm --network``: real Chromium peers behind links of a given speed, against the same session
on loopback.

One package (bytetext, ``--network-chunks`` chunks, seed 0) is served by ``peertrain serve`` (k = 3, one pass, the
codec under test, ``--min-peers`` = the peers so round 1 starts with all of them); ``--network-peers`` headless
Chromium pages (a browser context each) open it, either directly (loopback, the anchor) or each through its own
``server.harness.link.ShapedLink`` (``--link``, default 10/50/20: 10 Mbit/s up, 50 down, 20 ms one way): a TCP proxy
per peer, one queue per direction shared by the page's requests and its event stream, as an access link is (DevTools'
emulation reaches the worker's fetches too, but throttles each request on its own). The figure: the wall time of
rounds 2 to the last (the first merge's time to the last merge's: the pages' boot is left out), behind the links
over loopback, per codec, from the same run; and the bytes each link carried per round in those rounds.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from server.browser.peers import join_url
from server.harness.link import LinkSpec, ShapedLink
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.options import RelayOptions
from server.session.config import SessionConfig
from server.session.package import build_package

POLL_S = 0.5


@dataclass
class NetworkRun:
    codec: str
    link: str  # "loopback" or the link's spec
    rounds: int
    seconds: float  # rounds 2.. last
    up_bytes_per_round: float | None = None  # per peer, in rounds 2.. last (links only)
    down_bytes_per_round: float | None = None
    final_metric: float | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--network", action="store_true",
                        help="run the network half instead: Chromium peers behind shaped links against loopback")
    parser.add_argument("--link", default="10/50/20",
                        help="network half: each peer's link as UP/DOWN/DELAY in Mbit/s, Mbit/s, ms (default 10/50/20)")
    parser.add_argument("--network-codecs", default="none,int8,topk",
                        help="network half: comma-separated codecs (default none,int8,topk)")
    parser.add_argument("--network-peers", type=int, default=3, help="network half: Chromium pages (default 3)")
    parser.add_argument("--network-chunks", type=int, default=30,
                        help="network half: bytetext chunks; k = 3 and one pass make chunks / 3 rounds (default 30)")
    parser.add_argument("--network-timeout", type=float, default=1800.0,
                        help="network half: seconds each session may take before the bench gives up (default 1800)")


def run_network(args: argparse.Namespace) -> int:
    link = LinkSpec.parse(args.link)
    runs: list[NetworkRun] = []
    with tempfile.TemporaryDirectory(prefix="peertrain-comm-network-") as folder:
        package = build_package("bytetext", {"chunks": args.network_chunks}, Path(folder) / "package", seed=0,
                                check=False, log=lambda _: None)
        print(f"package: bytetext, {package.data.num_units} chunks, {package.task.spec().size:,} weights", flush=True)
        for codec in args.network_codecs.split(","):
            for spec in (None, link):
                run = network_session(Path(folder), codec, spec, peers=args.network_peers,
                                      timeout_s=args.network_timeout)
                runs.append(run)
                print(f"{codec} over {run.link}: rounds 2-{run.rounds} in {run.seconds:.1f} s", flush=True)
    print_network_table(runs, link)
    return 0


def network_session(folder: Path, codec: str, link: LinkSpec | None, *, peers: int, timeout_s: float) -> NetworkRun:
    from playwright.sync_api import sync_playwright

    from server.browser.chromium import launch_options

    name = f"{codec}-{'link' if link else 'loopback'}"
    serve = ServeCommand(package=folder / "package", session_dir=folder / name,
                         config=SessionConfig(participants=3, passes=1, codec=codec),
                         options=RelayOptions(admin_token=secrets.token_urlsafe(18), min_peers=peers))
    relay = RelayProcess(serve, log=folder / f"relay-{name}.log")
    relay.start()
    links = [ShapedLink(relay.host_port, link).start() for _ in range(peers)] if link else []
    try:
        with sync_playwright() as playwright, httpx.Client(base_url=relay.url, timeout=30) as http:
            browser = playwright.chromium.launch(**launch_options())
            try:
                for number in range(peers):
                    page = browser.new_context().new_page()
                    page.goto(join_url((links[number].url if links else relay.url) + "/"))
                return follow(http, name, codec, link, links, timeout_s)
            finally:
                browser.close()
    finally:
        for each in links:
            each.close()
        relay.stop()


def follow(http: httpx.Client, name: str, codec: str, link: LinkSpec | None, links: list[ShapedLink],
           timeout_s: float) -> NetworkRun:
    """Poll the relay's status until the session is done; the links' bytes when the first round merged."""
    deadline, first_bytes, shown = time.monotonic() + timeout_s, None, -1
    while time.monotonic() < deadline:
        status = http.get("/api/session").json()
        history = status["history"]
        if history and first_bytes is None:
            first_bytes = [(each.up.bytes, each.down.bytes) for each in links]
        if status["round"] != shown:
            shown = status["round"]
            print(f"  {name}: round {shown} of {status['num_rounds']}", flush=True)
        if status["done"]:
            rounds = len(history)
            seconds = history[-1]["time"] - history[0]["time"]
            run = NetworkRun(codec, str(link) if link else "loopback", rounds, seconds,
                             final_metric=(history[-1]["metrics"] or {}).get(status.get("metric", ""), None))
            if links and first_bytes and rounds > 1:
                run.up_bytes_per_round = statistics.fmean(
                    (each.up.bytes - start[0]) / (rounds - 1) for each, start in zip(links, first_bytes, strict=True))
                run.down_bytes_per_round = statistics.fmean(
                    (each.down.bytes - start[1]) / (rounds - 1) for each, start in zip(links, first_bytes, strict=True))
            return run
        time.sleep(POLL_S)
    raise TimeoutError(f"{name}: the session was not done after {timeout_s:.0f} s")


def print_network_table(runs: list[NetworkRun], link: LinkSpec) -> dict[str, Any]:
    print(f"\nChromium peers behind {link} links against loopback (rounds 2 to the last, the same session)")
    print("| codec | loopback s | behind the links s | links / loopback | up per peer per round | down per peer "
          "per round |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    figures: dict[str, Any] = {}
    for codec in dict.fromkeys(run.codec for run in runs):
        loop = next(run for run in runs if run.codec == codec and run.link == "loopback")
        shaped = next(run for run in runs if run.codec == codec and run.link != "loopback")
        ratio = shaped.seconds / loop.seconds
        print(f"| {codec} | {loop.seconds:.1f} | {shaped.seconds:.1f} | {ratio:.2f}x | "
              f"{(shaped.up_bytes_per_round or 0) / 1e6:.2f} MB | {(shaped.down_bytes_per_round or 0) / 1e6:.2f} MB |")
        figures[codec] = {"loopback_s": loop.seconds, "link_s": shaped.seconds, "ratio": ratio,
                          "up_bytes_per_round": shaped.up_bytes_per_round,
                          "down_bytes_per_round": shaped.down_bytes_per_round}
    return figures
