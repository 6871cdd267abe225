"""A peer of a session with a join code re-joins, with its code, when the relay no longer knows its token.

The relay is stopped and started again on the same port with a new session (``--fresh``, the same join
code): the page's stored token is refused (401), its worker joins again with the code the user typed,
fetches the new session's task and weights and trains the new session to the end. Joining again with an
empty body, as a peer that forgot its code would, is refused with 403 and would leave the page failed.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from browser_helpers import (
    BOOT_SECONDS,
    REPO_ROOT,
    admin,
    check_pages,
    recorded_results,
    relay_options,
    start_relay,
    stop,
    wait_for_status,
)
from playwright.sync_api import Page

from server.browser.launcher import READY_SELECTOR
from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]

JOIN_CODE = "owl-7431"
# 4 chunks of 256 rows, 2 local epochs: a unit trains in milliseconds. Two units per round, one page.
SETTINGS = {"chunks": 4, "examples": 1024, "epochs": 2}
TASK = str(REPO_ROOT / "examples" / "majority_task.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_units(page: Page, count: int, *, timeout_s: float) -> int:
    """Wait until the page has uploaded ``count`` units; returns how many it has."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = int(page.evaluate("window.peertrain.unitsDone"))
        if done >= count:
            return done
        check_pages([page])
        page.wait_for_timeout(50)
    pytest.fail(f"the page uploaded {page.evaluate('window.peertrain.unitsDone')} units, not {count}, in "
                f"{timeout_s:.0f} s; it is {page.evaluate('window.peertrain.activity')!r}")


def test_peer_rejoins_a_new_session_with_its_join_code(page: Page, tmp_path: Path) -> None:
    session_dir = tmp_path / "session"
    port = free_port()

    def session(passes: int, *, fresh: bool = False) -> ServeCommand:
        return ServeCommand(task=TASK, task_settings=SETTINGS, session_dir=session_dir, fresh=fresh,
                            config=SessionConfig(participants=2, passes=passes),
                            options=relay_options(min_peers=1, join_code=JOIN_CODE), port=port)

    # The first session is long (40 rounds), so it is still running when its relay is stopped.
    relay, url = start_relay(session(20), log_name="relay-rejoin-1.log")
    try:
        # The way a user joins: open the page, type the code, press the button.
        page.goto(url)
        page.locator(READY_SELECTOR).wait_for(timeout=BOOT_SECONDS * 1000)
        check_pages([page])
        page.fill("#join-code", JOIN_CODE)
        page.click("#join", timeout=30_000)
        wait_for_units(page, 2, timeout_s=120)
        admin(url, "pause")  # keep the first session unfinished while the relay goes away
        first_peer = page.evaluate("window.peertrain.peerId")
        first = wait_for_status(url, lambda s: s["paused"], timeout_s=10, what="the pause")
        assert not first["done"] and first["counters"].get("results_accepted", 0) >= 2, first
        stop(relay)
        first_units = int(page.evaluate("window.peertrain.unitsDone"))

        # A new session (three passes: six rounds of two units) behind the same address and join code.
        relay, again = start_relay(session(3, fresh=True), log_name="relay-rejoin-2.log")
        assert again == url
        final = wait_for_status(url, lambda s: s["done"], timeout_s=180, what="the new session to finish",
                                pages=[page], relay=relay)
        page.locator("body[data-peer='finished']").wait_for(timeout=30_000)
        second_peer = page.evaluate("window.peertrain.peerId")
        units_done = int(page.evaluate("window.peertrain.unitsDone"))
        state = page.evaluate("window.peertrain.state")
    finally:
        stop(relay)

    counters = final["counters"]
    # The stored token was refused, the page joined again with its code (never without it) and trained on.
    assert counters.get("refused.unauthorized", 0) >= 1, counters
    assert "refused.join_code" not in counters, counters
    assert state == "ready"
    assert second_peer and second_peer != first_peer
    assert final["num_rounds"] == 6 and [entry["round"] for entry in final["history"]] == list(range(6))
    assert counters["results_accepted"] == 12 and final["peers"]["joined"] == 1, (counters, final["peers"])
    results = recorded_results(session_dir)
    assert len(results) == 12 and {r.peer_id for r in results} == {second_peer}
    assert units_done == first_units + 12, (first_units, units_done)
