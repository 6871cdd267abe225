"""A volunteer in a real browser: its page keeps a WebCrypto key in IndexedDB and proves it at each join, so a reload
in the same browser profile is the same volunteer with its credit, name and team; another profile is another
volunteer. The page shows what it gave, the leaderboard and the teams; "Who takes part" lists volunteers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_helpers import (
    ARITH_SETTINGS,
    BOOT_SECONDS,
    admin,
    close_pages,
    relay_options,
    start_relay,
    stop,
    wait_for_status,
    wait_js,
)
from playwright.sync_api import Browser, Page

from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def volunteer_of(page: Page) -> str:
    page.wait_for_selector("#volunteer-who", timeout=BOOT_SECONDS * 1000)
    wait_js(page, "window.peertrain.volunteer !== undefined", 30)
    return str(page.evaluate("window.peertrain.volunteer"))


def credit_of(url: str, volunteer: str) -> dict[str, Any] | None:
    answer = httpx.get(url + "api/credit", params={"volunteer": volunteer, "top": 100}, timeout=10).json()
    return answer["you"]


def entry(status: dict[str, Any], volunteer: str) -> dict[str, Any] | None:
    return next((v for v in status["volunteers"] if v["volunteer"] == volunteer), None)


def test_a_volunteer_keeps_its_key_credit_and_name_across_a_reload(browser: Browser, tmp_path: Path,
                                                                   artifacts_dir: Path) -> None:
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=2, passes=3), options=relay_options(backup_after=None))
    relay, url = start_relay(serve, log_name="relay-volunteer.log")
    pages: list[Page] = []
    try:
        admin(url, "pause")
        ada = browser.new_context().new_page()
        pages.append(ada)
        ada.goto(url + "?workers=1")
        ada_id = volunteer_of(ada)
        ada.fill("#volunteer-name", "Ada")
        ada.fill("#volunteer-team", "Lab")
        ada.click("#volunteer-save")
        wait_js(ada, "document.getElementById('volunteer-note').textContent.length > 0", 30)
        ada.click("#join")
        bob = browser.new_context().new_page()  # another browser profile
        pages.append(bob)
        bob.goto(url + "?join=1&workers=1")
        bob_id = volunteer_of(bob)
        wait_for_status(url, lambda s: s["peers"]["joined"] >= 2, timeout_s=BOOT_SECONDS + 60, what="two pages",
                        pages=pages, relay=relay)
        admin(url, "resume")
        wait_for_status(url, lambda s: (credit_of(url, ada_id) or {}).get("total", 0) > 0, timeout_s=240,
                        what="Ada's first credit", pages=pages, relay=relay)
        admin(url, "pause")  # (the session waits for the reloaded page: a small one would end before it joins)
        before = credit_of(url, ada_id)
        assert before is not None
        ada.goto(url + "?join=1&workers=1")  # a reload, in the same profile
        assert volunteer_of(ada) == ada_id
        wait_for_status(url, lambda s: len((entry(s, ada_id) or {}).get("peers", [])) == 2, timeout_s=BOOT_SECONDS,
                        what="the reloaded page to join as the same volunteer", pages=pages, relay=relay)
        admin(url, "resume")
        final = wait_for_status(url, lambda s: s["done"], timeout_s=300, what="the session to finish", pages=pages,
                                relay=relay)
        wait_js(ada, "document.getElementById('you-gave').textContent.startsWith('You gave')", 30)
        gave = ada.inner_text("#you-gave")
        board = ada.inner_text("#leaderboard")
        mine = ada.eval_on_selector_all("#leaderboard tr[data-mine] td", "cells => cells.map(c => c.textContent)")
        teams = ada.inner_text("#teams")
        people = ada.eval_on_selector_all("#participants tbody tr", "rows => rows.map(r => r.cells[0].textContent)")
        ada.screenshot(path=str(artifacts_dir / "page-volunteer.png"), full_page=True)
        after = credit_of(url, ada_id)
    finally:
        close_pages(pages)
        stop(relay)
    assert bob_id != ada_id
    ada_entry, bob_entry = entry(final, ada_id), entry(final, bob_id)
    assert ada_entry is not None and bob_entry is not None
    assert len(ada_entry["peers"]) == 2 and ada_entry["name"] == "Ada" and ada_entry["team"] == "Lab"  # one person
    assert after is not None and after["total"] >= before["total"] and after["units"] >= before["units"]
    assert after["name"] == "Ada" and after["team"] == "Lab"
    assert "You gave" in gave and "GFLOP" in gave
    assert "Ada" in board and mine and mine[1] == "Ada" and "Lab" in teams
    assert "Ada" in people and any(name.startswith("volunteer-") for name in people)  # Bob: anonymous
