"""Nothing is lost: a peer that vanishes mid-unit and a relay killed mid-round, with real browsers.

- A page's browser goes away while its worker trains a unit without saying so (a crash, a lost network: unlike a page
  closed normally, which frees its leases at once: tests/browser/test_workers_browser.py): the lease expires, the
  other peer trains the unit, the round completes, and every unit of the pass is trained exactly once.
- The relay process gets SIGKILL mid-round and is started again on the same port and session folder:
  it resumes from its last checkpoint, the pages' workers reconnect with their stored tokens, the
  session completes, and replaying the recorded results reproduces the final weights bit for bit.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
from browser_helpers import (
    ARITH_SETTINGS,
    ARTIFACTS,
    BOOT_SECONDS,
    check_pages,
    close_pages,
    final_checkpoint,
    open_peers,
    recorded_results,
    relay_options,
    replay,
    start_relay,
    stop,
    wait_for_status,
)
from playwright.sync_api import Browser, Page, Route

from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def wait_for_victim(victim: Page, lost: list[str]) -> str:
    """The victim's peer id, once its first result upload was dropped (it trained a unit and holds its lease)."""
    deadline = time.monotonic() + BOOT_SECONDS + 60
    while not any("/api/result" in url for url in lost):
        check_pages([victim])
        assert time.monotonic() < deadline, victim.evaluate("[document.body.dataset.state, window.peertrain.activity]")
        victim.wait_for_timeout(50)  # (Playwright's own wait: the route handler runs meanwhile)
    return str(victim.evaluate("window.peertrain.peerId"))


def test_closed_page_mid_unit_is_covered_by_lease_expiry(browser: Browser, tmp_path: Path) -> None:
    # One round of two units of 60 steps each (~3 s in Pyodide); a lease lasts 20 s, ample on busy cores.
    session_dir = tmp_path / "session"
    settings = {**ARITH_SETTINGS, "chunks": 2, "steps": 60}
    # --no-backups: an idle page would race the closed page's unit first (tests/server/relay/test_backups.py); this
    # test is about the lease running out. --min-peers 2: each page takes one of the two units (a page that booted
    # first could train both before the other asked).
    serve = ServeCommand(task="arith", task_settings=settings, session_dir=session_dir,
                         config=SessionConfig(participants=2, passes=1),
                         options=relay_options(lease_seconds=20, backup_after=None, min_peers=2))
    relay, url = start_relay(serve, log_name="relay-lease.log")
    pages: list[Page] = []
    lost: list[str] = []  # the victim's uploads and goodbye, dropped as a dead network drops them

    def dead_network(route: Route) -> None:
        lost.append(route.request.url)
        route.abort()

    try:
        pages = open_peers(browser, url, 2)
        victim, survivor = pages
        # The victim's worker trains a unit whose result never reaches the relay, and its goodbye never does either (a
        # browser that crashes or loses its network sends none): both are dropped from the start, so that however
        # fast its unit, it dies mid-unit for the relay. (Once the fetch was taken away only after the page was seen
        # training; under load its result was in by then, and no lease ran out.)
        victim.context.route(re.compile(r"/api/(result|leave)"), dead_network)
        victim_id = wait_for_victim(victim, lost)
        # (the page's goodbye on closing is a keepalive fetch that routes do not see: it goes with the page's fetch)
        victim.evaluate("() => { window.fetch = () => Promise.reject(new Error('no network')); }")
        victim.context.close()
        status = wait_for_status(url, lambda s: s["round_progress"]["done"] >= 1, timeout_s=60,
                                 what="the surviving peer's unit", pages=[survivor], relay=relay)
        assert status["round"] == 0
        final = wait_for_status(url, lambda s: s["done"], timeout_s=120, what="the lease to expire and the round "
                                "to complete", pages=[survivor], relay=relay)
        survivor_id = survivor.evaluate("window.peertrain.peerId")
    finally:
        close_pages([page for page in pages if not page.is_closed()])
        stop(relay)

    assert final["counters"].get("leases_expired", 0) >= 1, final["counters"]
    entry = final["history"][0]
    assert entry["participants"] == 2 and entry["missing"] == [], entry
    results = recorded_results(session_dir)
    # Every unit of the pass exactly once, both by the survivor; nothing from the closed page.
    assert sorted(r.unit_index for r in results) == [0, 1]
    assert {r.peer_id for r in results} == {survivor_id} != {victim_id}
    replayed, _ = replay(session_dir, results)
    assert np.array_equal(replayed.weights, final_checkpoint(session_dir, 1).weights)


def test_relay_killed_mid_round_resumes_and_finishes(browser: Browser, tmp_path: Path) -> None:
    # Three rounds of two units of 40 steps; the relay dies while round 1 (the second) is in flight.
    session_dir = tmp_path / "session"
    settings = {**ARITH_SETTINGS, "steps": 40}
    serve = ServeCommand(task="arith", task_settings=settings, session_dir=session_dir,
                         config=SessionConfig(participants=2, passes=1), options=relay_options())
    relay, url = start_relay(serve, log_name="relay-kill-1.log")
    pages: list[Page] = []
    refused: list[str] = []  # round 1's uploads, dropped as a lost connection drops them

    def drop(route: Route) -> None:
        refused.append(route.request.url)
        route.abort()

    round_1 = re.compile(r"/api/result\?round=1&")
    try:
        pages = open_peers(browser, url, 2)
        # Round 1 stays in flight until the kill, whatever the machine's speed: its uploads fail (the pages keep
        # their leases and try again); before, a fast unit could be uploaded between the poll and the kill.
        for page in pages:
            page.context.route(round_1, drop)
        wait_for_status(url, lambda s: s["round"] == 1 and s["round_progress"]["leased"] >= 1 and bool(refused),
                        timeout_s=BOOT_SECONDS + 60, what="round 1 in flight", pages=pages, relay=relay, poll_s=0.05)
        os.kill(relay.pid, signal.SIGKILL)
        relay.wait(timeout=10)
        for page in pages:
            page.context.unroute(round_1, drop)
        peer_ids = {page.evaluate("window.peertrain.peerId") for page in pages}

        port = urlsplit(url).port
        relay, again = start_relay(replace(serve, port=port), log_name="relay-kill-2.log")
        assert again == url
        final = wait_for_status(url, lambda s: s["done"], timeout_s=180, what="the resumed session to finish",
                                pages=pages, relay=relay)
        finished = [page.locator("body[data-peer='finished']") for page in pages]
        for locator in finished:
            locator.wait_for(timeout=15_000)  # each worker asked again, heard "done" and stopped
    finally:
        close_pages(pages)
        stop(relay)

    log = (ARTIFACTS / "relay-kill-2.log").read_text()
    assert re.search(r"resuming session in .* after round 1 of 3", log), log[-2000:]
    # The units in flight were handed out again; the peers came back with their stored tokens.
    assert final["counters"].get("leases_released_on_start", 0) >= 1, final["counters"]
    assert final["peers"]["joined"] == 2, final["peers"]
    assert [entry["round"] for entry in final["history"]] == [0, 1, 2]

    results = recorded_results(session_dir)
    assert sorted(r.unit_index for r in results) == list(range(6))
    assert {r.peer_id for r in results if r.round == 2} <= peer_ids
    # The resumed session ends exactly where an uninterrupted one would: the same results, merged the same way.
    replayed, _ = replay(session_dir, results)
    final_point = final_checkpoint(session_dir, 3)
    assert np.array_equal(replayed.weights, final_point.weights)
    assert [e["metrics"] for e in replayed.history] == [e["metrics"] for e in final["history"]]
