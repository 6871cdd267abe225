"""Helpers the browser tests share: a relay process (``peertrain serve`` logging into tests/artifacts), its
status, admin calls and pages that join, waits on the session's status, and the replay of what a relay recorded.

Plain functions called mid-test with the test's own arguments, so a module rather than fixtures; the fixtures
(a relay serving only the page, the artifacts folder, Chromium's launch options) are in ``conftest.py``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import Browser, Page

from runtime import wire
from runtime.tasks import UnitResult
from server.browser.launcher import launch_relay
from server.browser.peers import join_url
from server.harness.serve_command import ServeCommand
from server.relay.client import RelayClient, RelayRefusal
from server.relay.options import RelayOptions
from server.relay.store import StoredResult, open_store
from server.session import checkpoint_files as checkpoint
from server.session.package import Package
from server.session.session import Session, SessionConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"


def start_relay(serve: ServeCommand, *, log_name: str = "relay.log") -> tuple[subprocess.Popen, str]:
    """Start ``peertrain serve --port 0`` logging into tests/artifacts (kept for CI); the process and its URL.
    A session without relay options gets the tests' (``relay_options``: every result message kept)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if serve.options is None and not serve.no_session:
        serve = replace(serve, options=relay_options())
    return launch_relay(serve, log_path=ARTIFACTS / log_name)


def session_status(url: str) -> dict:
    """The relay's ``/api/session`` status, through the relay's Python client."""
    with httpx.Client(base_url=url, timeout=10) as http:
        return RelayClient(http).status()


def wait_until_done(page: Page, url: str, *, timeout_s: float) -> dict:
    """Poll the session until it is done (or the time is up); returns the last status."""
    deadline = time.monotonic() + timeout_s
    status = session_status(url)
    while not status["done"] and time.monotonic() < deadline:
        page.wait_for_timeout(1000)  # (not time.sleep: Playwright delivers page events during its own calls)
        status = session_status(url)
    return status


ADMIN_TOKEN = "test-admin"
# A small arithmetic task: 6 chunks of 100 problems, a 1-layer 32-wide transformer; a unit is ~4 steps.
ARITH_SETTINGS = {"num_examples": 600, "chunks": 6, "n_layer": 1, "n_embd": 32, "validation_size": 50,
                  "generalization_size": 20, "beyond_range_size": 10}
BOOT_SECONDS = 240  # several pages boot Pyodide at once on two cores that other work may share


def relay_options(**changes: Any) -> RelayOptions:
    """The tests' relay options: the admin token they call with, and every result message kept (these tests replay
    whole sessions natively), with ``changes``."""
    return RelayOptions(**{"admin_token": ADMIN_TOKEN, "keep_results": None, **changes})


def admin(url: str, action: str) -> None:
    httpx.post(url + f"api/admin/{action}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
               timeout=10).raise_for_status()


def check_pages(pages: Sequence[Page]) -> None:
    """Fail at once, with the page's message, when a page could not boot."""
    for page in pages:
        if not page.is_closed() and page.evaluate("document.body.dataset.state") == "failed":
            pytest.fail(f"a page failed to boot: {page.inner_text('#error')}")


def wait_for_status(url: str, predicate: Callable[[dict[str, Any]], bool], *, timeout_s: float, what: str,
                    pages: Sequence[Page] = (), relay: subprocess.Popen | None = None,
                    poll_s: float = 0.25) -> dict[str, Any]:
    """Poll ``/api/session`` until ``predicate`` holds; pages and the relay are checked on the way."""
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if relay is not None and relay.poll() is not None:
            pytest.fail(f"the relay exited with {relay.returncode} while waiting for {what}")
        try:
            status = session_status(url)
        except (OSError, httpx.HTTPError, RelayRefusal):  # refused or reset connections, timeouts, a 5xx: the relay
            # may be restarting
            status = {}
        if status and predicate(status):
            return status
        check_pages(pages)
        time.sleep(poll_s)
    brief = {k: status.get(k) for k in ("round", "num_rounds", "done", "peers", "round_progress", "counters")}
    seen = [page.evaluate("[document.body.dataset.state, window.peertrain.activity]") for page in pages
            if not page.is_closed()]
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; last status {brief}; pages {seen}")


def open_peers(browser: Browser, url: str, count: int) -> list[Page]:
    """``count`` pages, each in its own context (its own peer), that join as soon as Pyodide is up."""
    pages = []
    for _ in range(count):
        page = browser.new_context().new_page()
        page.goto(join_url(url))
        pages.append(page)
    return pages


def train_to_the_end(browser: Browser, url: str, count: int, relay: subprocess.Popen, pages: list[Page],
                     timeout_s: float = 300) -> dict[str, Any]:
    """Open ``count`` pages (each its own context) on a paused relay, resume once all joined, and return the
    finished session's status. ``pages`` (the caller's list, closed by the caller) receives them."""
    admin(url, "pause")
    for _ in range(count):
        page = browser.new_context().new_page()
        page.goto(join_url(url))
        pages.append(page)
    wait_for_status(url, lambda s: s["peers"]["joined"] >= count, timeout_s=BOOT_SECONDS + 60,
                    what=f"{count} pages to join", pages=pages, relay=relay)
    admin(url, "resume")
    return wait_for_status(url, lambda s: s["done"], timeout_s=timeout_s, what="the session to finish",
                           pages=pages, relay=relay)


def close_pages(pages: Sequence[Page]) -> None:
    for page in pages:
        page.context.close()


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def final_checkpoint(session_dir: Path, num_rounds: int, timeout_s: float = 30) -> checkpoint.Checkpoint:
    """The checkpoint after the last round (the status may say ``done`` a moment before it is on disk)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            latest = checkpoint.read_latest(session_dir)
            if int(latest.state["round"]) == num_rounds:
                return latest
        except (checkpoint.CheckpointError, OSError, ValueError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{session_dir} has no checkpoint after round {num_rounds}")


def recorded_results(session_dir: Path) -> list[StoredResult]:
    store = open_store(session_dir / "relay.sqlite3")
    try:
        return store.all_results()
    finally:
        store.close()


def fresh_session(session_dir: Path) -> Session:
    """A new in-process session on the relay's package with the relay's config, at round 0."""
    stored = checkpoint.read_session_config(session_dir)
    package = Package.load(session_dir / "package")
    return Session.create(package, SessionConfig.from_json(stored["config"]))


def replay(session_dir: Path, results: Sequence[StoredResult]) -> tuple[Session, list[np.ndarray]]:
    """Feed the recorded results, round by round in slot order, to a fresh session's ``complete_round``.

    Returns the session and the global weights before each round (what the peers trained from).
    """
    session = fresh_session(session_dir)
    by_round: dict[int, list[StoredResult]] = {}
    for result in results:
        by_round.setdefault(result.round, []).append(result)
    before = []
    while not session.done and session.round in by_round:
        before.append(session.weights.copy())
        planned = {a.slot: a for a in session.assignments()}
        pairs = []
        for result in sorted(by_round[session.round], key=lambda r: r.slot):
            _, vector = wire.decode(result.message, expect_spec=session.spec)
            pairs.append((planned[result.slot], UnitResult(vector, result.num_examples, result.metrics)))
        session.complete_round(pairs)
    return session, before


def wait_js(page: Page, expression: str, timeout_s: float) -> None:
    """Poll ``expression`` in the page (its CSP forbids the string evaluation wait_for_function uses)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"{expression} did not hold in {timeout_s} s"
        time.sleep(0.1)
