"""A person trying peertrain alone: the default ``peertrain serve`` (k = 3, no --min-peers) with one page open
finishes its session; that page trains every unit of every round in turn and says there is no start gate."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import ARITH_SETTINGS, BOOT_SECONDS, start_relay, stop, task_args, wait_for_status
from playwright.sync_api import Page

from server.browser.peers import join_url

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_default_serve_with_one_page_finishes(page: Page, tmp_path: Path) -> None:
    relay, url = start_relay(*task_args("arith", ARITH_SETTINGS, "--session-dir", str(tmp_path / "session")),
                             log_name="relay-one-page.log")
    try:
        page.goto(join_url(url))
        status = wait_for_status(url, lambda s: s["done"], timeout_s=BOOT_SECONDS + 600, what="the session to end",
                                 pages=[page], relay=relay)
        assert status["peers"]["needed"] == 1 and status["plan"]["participants_per_round"] == 3
        assert len(status["history"]) == status["num_rounds"] and status["waiting"] is None
        units = sum(len(entry["units"]) for entry in status["history"])
        page.wait_for_function(f"window.peertrain.unitsDone === {units}")  # all of them, by this one page
        assert "no start gate" in page.inner_text("#peers")
        page.wait_for_function("document.getElementById('session-status').textContent.startsWith('finished')")
    finally:
        stop(relay)
