"""A page whose uploads are subtly poisoned in flight is banned after its first checked result.

Three Chromium pages train a small arithmetic session; Playwright rewrites one page's ``POST /api/result``
(``page.route``) to ``global + 1.5 * update``: an update in the honest direction, 1.5 times as long, inside
every norm bound a relay can set without refusing honest peers. The relay replays every peer's first result
and the replay differs by half the update, so that page is banned (its page says so), its results of the open round
are dropped and handed to the others, and what it had merged (a routine replay is judged before the next round
merges: once at most) is undone; the session finishes, and no honest page is banned.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from browser_helpers import ADMIN_TOKEN, ARITH_SETTINGS, close_pages, relay_options, start_relay, stop, wait_for_status
from playwright.sync_api import Browser, Page
from poisoning import Poisoner, open_pages

from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def subtle(global_weights: np.ndarray, result: np.ndarray) -> np.ndarray:
    return (global_weights + 1.5 * (result.astype(np.float64) - global_weights)).astype(np.float32)


def test_a_subtly_poisoning_page_is_banned_after_its_first_checked_result(browser: Browser, tmp_path: Path) -> None:
    session_dir = tmp_path / "session"
    # (Address bans are off by default: all three pages come from 127.0.0.1.) No backups: the intercepted page is
    # the slow one, and a backup would race it and turn its first check into a copy comparison
    # (tests/server/relay/test_backups.py).
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=session_dir,
                         config=SessionConfig(participants=3, passes=2),
                         options=relay_options(min_peers=1, backup_after=None))
    relay, url = start_relay(serve, log_name="relay-replay-ban.log")
    poisoner = Poisoner(url, poison=subtle)
    pages: list[Page] = []
    try:
        open_pages(browser, url, 3, poisoner, pages, relay)
        wait_for_status(url, lambda s: s["counters"].get("peers_banned", 0) >= 1, timeout_s=180,
                        what="the poisoning page to be banned", pages=pages, relay=relay)
        final = wait_for_status(url, lambda s: s["done"], timeout_s=240, what="the session to finish",
                                pages=pages, relay=relay)
        banned_text = [page.evaluate("window.peertrain.banned || null") for page in pages]
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        listing = httpx.get(url + "api/admin/peers", headers=headers, timeout=10).json()["peers"]
        exported = httpx.get(url + "api/admin/export/results", headers=headers, timeout=10).text
        audit = [json.loads(line) for line in exported.splitlines() if line]
    finally:
        close_pages(pages)
        stop(relay)

    counters = final["counters"]
    seen = f"poisoned {poisoner.poisoned}, counters {counters}, banned pages {banned_text}"
    assert counters["peers_banned"] == 1 and counters["verification_failed"] >= 1, seen
    banned = [peer for peer in listing if peer["banned"]]
    assert len(banned) == 1 and "differs from the host's replay" in banned[0]["ban_reason"], listing
    # The poisoning page is told why; the honest pages are not banned.
    assert banned_text[0] and "banned" in banned_text[0] and banned_text[1:] == [None, None], seen
    # Banned after its first checked result, which is judged before the next round merges: at most the uploads it
    # made until then, and each of its results that reached a merge is undone.
    assert 1 <= len(poisoner.poisoned) <= 3, seen
    theirs = [row for row in audit if row["peer_id"] == banned[0]["peer_id"]]
    assert all(row["verification"].startswith("undone") for row in theirs), (theirs, seen)
    assert counters.get("undos", 0) == (1 if theirs else 0), seen
    assert [entry["round"] for entry in final["history"]] == list(range(final["num_rounds"])), seen
    # every unit merged once (6 chunks, 2 passes): an undone result's unit is carried into a later round
    assert sum(entry["participants"] for entry in final["history"]) == 6 * 2, seen
