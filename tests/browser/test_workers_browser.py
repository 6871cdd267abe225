"""Several training workers in one page: each a peer of its own, booted from the browser's cache after the first,
changed by the page's "Cores to give" control while a session runs without losing a unit, every lease freed when
the page closes, and the same computation as that many pages with one worker each."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser_helpers import (
    ARITH_SETTINGS,
    BOOT_SECONDS,
    close_pages,
    final_checkpoint,
    relay_options,
    start_relay,
    stop,
    wait_for_status,
)
from playwright.sync_api import Browser, BrowserType, Page, Request
from playwright.sync_api import Error as PlaywrightError

from server.browser.chromium import launch_options
from server.browser.peers import join_url
from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LONG_LEASE = 900.0  # seconds: a lease never runs out in these tests, only leaving frees one
SLOWER = {**ARITH_SETTINGS, "epochs": 60}  # a unit of a second or two: the session outlasts a worker's boot
# (without host replays: after 240 local steps a native replay of a browser unit drifts past the 1 % tolerance, so the
# relay banned an honest worker in a trial run; replays on the browser's own engine are another issue's work)
CORES_PASSES = 6  # 36 such units: the session outlasts a second worker's boot and the pause
WORKERS = """() => window.peertrain.workers.map((w) => ({ index: w.index, state: w.state, peerId: w.peerId,
  joined: w.joined, units: w.unitsDone, error: w.error }))"""


def workers_of(page: Page) -> list[dict[str, Any]]:
    return list(page.evaluate(WORKERS))


def wait_for_page(page: Page, check: Any, *, what: str, timeout_s: float = BOOT_SECONDS) -> list[dict[str, Any]]:
    """Poll the page's workers until ``check(workers)`` holds (the page's CSP forbids wait_for_function's eval)."""
    deadline = time.monotonic() + timeout_s
    while True:
        workers = workers_of(page)
        if check(workers):
            return workers
        if any(w["state"] == "failed" for w in workers):
            pytest.fail(f"a worker failed: {workers}")
        if page.evaluate("document.body.dataset.state") == "failed":
            pytest.fail(f"the page failed: {page.inner_text('#error')}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; the workers: {workers}")
        page.wait_for_timeout(250)


def page_rows_of_mine(page: Page, wanted: list[str], tries: int = 240) -> list[str]:
    """The peers of the volunteer the page's participants table marks as its own (its workers are one volunteer:
    one row), once they are ``wanted`` (the table follows the status stream, which trails a worker's own count of
    its uploads by up to a status interval)."""
    mine: list[str] = []
    for _ in range(tries):  # (bounded: a minute of 0.25 s polls)
        mine = sorted(page.eval_on_selector_all("#participants tr[data-mine]",
                                                "rows => rows.flatMap(r => r.dataset.peers.split(' '))"))
        if mine == wanted:
            break
        page.wait_for_timeout(250)
    return mine


def history_of(session_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session_dir / "history.jsonl").read_text().splitlines() if line.strip()]


def give_cores(page: Page, cores: int, *, unit_between: bool = False) -> None:
    """What a volunteer does: type the number into the "Cores to give" control and confirm it.

    ``unit_between``: a worker finishes a unit between the keystrokes and Enter, as it often does for a person
    (each unit redraws the page's workers, which once put the old count back into the control and lost the change).
    """
    page.fill("#cores", str(cores))
    if unit_between:
        done = sum(w["units"] for w in workers_of(page))
        wait_for_page(page, lambda ws: sum(w["units"] for w in ws) > done, what="a unit while typing")
    page.press("#cores", "Enter")
    assert page.input_value("#cores") == str(cores)


def test_two_workers_boot_once_from_the_network_train_as_two_peers_and_leave_with_the_page(
        browser_type: BrowserType, tmp_path: Path) -> None:
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=3, passes=40),
                         options=relay_options(lease_seconds=LONG_LEASE))
    relay, url = start_relay(serve, log_name="relay-workers-1.log")
    # A profile on disk, as a volunteer's browser has: an incognito context keeps its cache in memory, where
    # Chromium does not keep a file as large as Pyodide's 10 MB interpreter.
    context = browser_type.launch_persistent_context(str(tmp_path / "profile"), **launch_options())
    fetched: dict[str, list[int]] = defaultdict(list)  # path -> body bytes of each fetch (<= 0: the browser's cache)
    try:
        page = context.new_page()
        def finished(request: Request) -> None:
            try:
                size = request.sizes()["responseBodySize"]
            except PlaywrightError:  # (a request still finishing as the context closes: not one the test reads)
                return
            fetched[request.url.removeprefix(url.rstrip("/"))].append(size)

        page.on("requestfinished", finished)
        page.goto(join_url(url, 2))
        workers = wait_for_page(page, lambda ws: len(ws) == 2 and all(w["units"] >= 1 for w in ws),
                                what="two workers to upload a unit each")
        assert len({w["peerId"] for w in workers}) == 2  # two peers, each with its own token and leases
        ids = sorted(w["peerId"][:8] for w in workers)  # (the table shows 8 characters of an id)
        mine = page_rows_of_mine(page, ids)
        assert mine == ids
        assert page.is_visible("#workers") and page.locator("#workers li").count() == 2

        assets = {path: sizes for path, sizes in fetched.items() if path.startswith("/pyodide/")}
        assert {"/pyodide/pyodide.asm.wasm", "/pyodide/python_stdlib.zip", "/pyodide/pyodide-lock.json"} <= set(assets)
        assert any(path.endswith(".whl") for path in assets)
        for path, sizes in assets.items():
            assert len(sizes) == 2, (path, sizes)  # one boot per worker...
            assert sizes[0] > 0 and sizes[1] <= 0, (path, sizes)  # ...the second from the cache (or a 304)

        status = wait_for_status(url, lambda s: s["peers"]["connected"] == 2, timeout_s=60, what="two connected")
        assert not status["done"]
        page.close()  # the page tells the relay that both of its peers are going
        status = wait_for_status(url, lambda s: s["counters"].get("peers_left", 0) == 2, timeout_s=60,
                                 what="both workers to leave", relay=relay)
        assert status["peers"]["connected"] == 0
        assert status["round_progress"]["leased"] == 0  # every lease the page held is free at once
    finally:
        context.close()
        stop(relay)


def test_the_cores_control_changes_the_workers_while_the_session_runs_without_losing_a_unit(
        browser: Browser, tmp_path: Path) -> None:
    serve = ServeCommand(task="arith", task_settings=SLOWER, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=3, passes=CORES_PASSES),
                         options=relay_options(verify=False, lease_seconds=LONG_LEASE))
    relay, url = start_relay(serve, log_name="relay-workers-2.log")
    pages: list[Page] = []
    try:
        pages.append(page := browser.new_context().new_page())
        page.goto(join_url(url, 1))
        first = wait_for_page(page, lambda ws: len(ws) == 1 and ws[0]["units"] >= 1, what="one worker's unit")[0]

        give_cores(page, 2, unit_between=True)
        workers = wait_for_page(page, lambda ws: len(ws) == 2 and ws[1]["units"] >= 1, what="a second worker's unit")
        assert workers[0]["peerId"] == first["peerId"] and workers[1]["peerId"] != first["peerId"]

        give_cores(page, 0)  # paused: each worker uploads the unit in hand and leaves
        status = wait_for_status(url, lambda s: s["counters"].get("peers_left", 0) == 2, timeout_s=120,
                                 what="both workers to leave", relay=relay)
        assert not status["done"] and status["round_progress"]["leased"] == 0
        workers = wait_for_page(page, lambda ws: len(ws) == 1 and not ws[0]["joined"], what="the pause", timeout_s=30)
        assert page.input_value("#cores") == "0"

        give_cores(page, 1)  # the first worker comes back as the same peer and trains to the end
        status = wait_for_status(url, lambda s: s["done"], timeout_s=600, what="the session to finish", relay=relay,
                                 pages=pages)
        assert workers_of(page)[0]["peerId"] == first["peerId"]
        final_checkpoint(tmp_path / "session", status["num_rounds"])
        history = history_of(tmp_path / "session")
        assert len(history) == status["num_rounds"]
        assert all(entry["participants"] == 3 and not entry["missing"] for entry in history)
        assert "leases_expired" not in status["counters"]
        assert sorted(unit for entry in history for unit in entry["units"]) == sorted(list(range(6)) * CORES_PASSES)

        give_cores(page, 2)  # remembered in this browser: a later visit without ?workers= starts with it
        page.goto(url)
        page.wait_for_selector("#cores-note:not(:empty)")
        assert page.input_value("#cores") == "2" and page.evaluate("window.peertrain.cores") == 2
    finally:
        close_pages(pages)
        stop(relay)


def train_session(browser: Browser, session_dir: Path, log_name: str,
                  pages_and_workers: list[int]) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """A session trained by pages with the given worker counts; returns its final weights and its history."""
    peers = sum(pages_and_workers)
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=session_dir,
                         config=SessionConfig(participants=3, passes=2), options=relay_options(min_peers=peers))
    relay, url = start_relay(serve, log_name=log_name)
    pages: list[Page] = []
    try:
        for workers in pages_and_workers:
            pages.append(page := browser.new_context().new_page())
            page.goto(join_url(url, workers))
        for page, workers in zip(pages, pages_and_workers, strict=True):
            wait_for_page(page, lambda ws, n=workers: len(ws) == n and all(w["peerId"] for w in ws),
                          what=f"{workers} workers to join")
        status = wait_for_status(url, lambda s: s["done"], timeout_s=BOOT_SECONDS + 300, what="the session to finish",
                                 pages=pages, relay=relay)
        assert status["peers"]["joined"] == peers
        return final_checkpoint(session_dir, status["num_rounds"]).weights, history_of(session_dir)
    finally:
        close_pages(pages)
        stop(relay)


def test_one_page_with_two_workers_computes_what_two_pages_with_one_worker_each_do(browser: Browser,
                                                                                  tmp_path: Path) -> None:
    one_page, one_history = train_session(browser, tmp_path / "one-page", "relay-workers-3a.log", [2])
    two_pages, two_history = train_session(browser, tmp_path / "two-pages", "relay-workers-3b.log", [1, 1])
    assert len(one_history) == len(two_history) > 0
    assert [entry["units"] for entry in one_history] == [entry["units"] for entry in two_history]
    assert [entry["metrics"] for entry in one_history] == [entry["metrics"] for entry in two_history]
    np.testing.assert_array_equal(one_page, two_pages)  # bit for bit: the same computation
