"""Three Chromium pages, one slowed about 4x: what do backups buy in real wall time?

CDP ``Emulation.setCPUThrottlingRate`` does not reach the page's dedicated Web Worker, where units train: on the
page it slows the main thread only (a unit timed in the worker was as fast throttled as not), and sent to the
worker's own target Chromium answers "Operation is only supported for pages, not workers" (checked below). What
works: the slow page runs in a browser of its own whose renderer processes are stopped and continued by signals
(SIGSTOP 90 ms, SIGCONT 20 ms; the figures say what slowdown that gave in the worker).

Each session: arith, k = 3, 2 passes (4 rounds of 3 units), a fresh relay; the pages join while it is paused,
the slow page first, then the session runs to the end: without backups, with backups as ``serve`` ships them
(after 1x the median unit) and with backups at once (``--backup-after 0``). A browser's idle peer holds its work
request up to ``hold_seconds`` (15 s) and nothing wakes it when the slow unit crosses the backup threshold; with
``--backup-after 0`` the threshold is crossed when it asks. Unit times come from the results (``metrics.seconds``,
timed in the worker). Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import start_relay
from playwright.sync_api import Browser, Page
from test_session_browsers import (
    ADMIN_TOKEN,
    ARITH_SETTINGS,
    BOOT_SECONDS,
    admin,
    close_pages,
    recorded_results,
    stop,
    task_args,
    wait_for_status,
)

from server.browser.chromium import launch_options
from server.browser.peers import join_url

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STOPPED_S, RUNNING_S = 0.09, 0.02
# 6 chunks of 400 problems, 8 local epochs: a unit takes seconds in the worker, longer than a merge or a poll
SETTINGS = {**ARITH_SETTINGS, "num_examples": 2400, "epochs": 8}


@contextmanager
def slowed(pids: list[int]) -> Iterator[None]:
    """Stop and continue ``pids`` in turn until the block ends (always continued at the end)."""
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(STOPPED_S)
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            time.sleep(RUNNING_S)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def worker_throttle_answer(browser: Browser, page: Page) -> str:
    """What Chromium answers to ``Emulation.setCPUThrottlingRate`` sent to the page's worker target."""
    session = browser.new_browser_cdp_session()
    answers: list[str] = []
    session.on("Target.receivedMessageFromTarget", lambda event: answers.append(event["message"]))
    worker = next(t for t in session.send("Target.getTargets")["targetInfos"] if t["type"] == "worker")
    attached = session.send("Target.attachToTarget", {"targetId": worker["targetId"], "flatten": False})
    session.send("Target.sendMessageToTarget", {"sessionId": attached["sessionId"], "message": json.dumps(
        {"id": 1, "method": "Emulation.setCPUThrottlingRate", "params": {"rate": 4}})})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any('"id":1' in a for a in answers):
        page.wait_for_timeout(100)  # (Playwright delivers events during its own calls)
    return next((a for a in answers if '"id":1' in a), "")


def one_session(browser: Browser, tmp_path: Path, name: str, *relay_args: str) -> dict[str, Any]:
    session_dir = tmp_path / name
    relay, url = start_relay(*task_args("arith", SETTINGS, "-k", "3", "--passes", "2", "--no-ban-addresses",
                                        "--session-dir", str(session_dir), *relay_args),
                             log_name=f"relay-stragglers-{name}.log")
    slow_browser = browser.browser_type.launch(**launch_options())
    pages: list[Page] = []
    try:
        admin(url, "pause")
        for count in range(1, 4):
            page = (slow_browser if count == 1 else browser).new_context().new_page()
            page.goto(join_url(url))
            pages.append(page)
            wait_for_status(url, lambda s, n=count: s["peers"]["joined"] >= n, timeout_s=BOOT_SECONDS,
                            what=f"page {count} to join", pages=pages, relay=relay)
        answer = worker_throttle_answer(slow_browser, pages[0])
        listing = httpx.get(url + "api/admin/peers", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            timeout=10).json()["peers"]
        slow_peer = listing[0]["peer_id"]  # (listed in join order)
        processes = slow_browser.new_browser_cdp_session().send("SystemInfo.getProcessInfo")["processInfo"]
        renderers = [int(p["id"]) for p in processes if p["type"] == "renderer"]
        with slowed(renderers):
            started = time.monotonic()
            admin(url, "resume")
            final = wait_for_status(url, lambda s: s["done"], timeout_s=600, what="the session to finish",
                                    pages=pages[1:], relay=relay, poll_s=0.1)
            wall = time.monotonic() - started
    finally:
        close_pages(pages)
        slow_browser.close()
        stop(relay)
    results = recorded_results(session_dir)
    slow = [r.metrics["seconds"] for r in results if r.peer_id == slow_peer]
    fast = [r.metrics["seconds"] for r in results if r.peer_id != slow_peer]
    figures = {"wall": round(wall, 1), "slow_unit": statistics.median(slow) if slow else None,
               "fast_unit": statistics.median(fast), "slow_merged": len(slow), "merged": len(results),
               "backups_won": final["counters"].get("backups_won", 0),
               "backups_out": final["counters"].get("backups_handed_out", 0), "rounds": final["round"],
               "worker_throttle": answer}
    print(f"{name}: {figures}")
    return figures


def test_a_slowed_page_and_backups_in_real_time(browser: Browser, tmp_path: Path) -> None:
    without = one_session(browser, tmp_path, "no-backups", "--no-backups")
    default = one_session(browser, tmp_path, "backups")
    at_once = one_session(browser, tmp_path, "backups-0", "--backup-after", "0")
    assert "only supported for pages, not workers" in without["worker_throttle"], without
    # The signals slow the page's worker (how much depends on what else the two cores run: the others' units
    # slow down as well when they share them); every unit is merged once whoever trained it.
    # Without backups the slowed page's own units are merged, so its unit time is measured there; with backups
    # the race may leave it none (its units merged from the backups).
    assert without["slow_unit"] is not None and without["slow_unit"] > 1.3 * without["fast_unit"], without
    for figures in (without, default, at_once):
        assert figures["merged"] == 12, figures
    print(f"session wall time over no backups: serve's backups {default['wall'] / without['wall']:.2f}, "
          f"backups at once {at_once['wall'] / without['wall']:.2f}")
