"""Differential privacy on the page: two Chromium peers train the CSV example on their own files in a session with
DP-FedAvg (``--dp-noise-multiplier``, ``--dp-epsilon-budget``); after each round the page shows the session's epsilon
(the accountant's, as the status gives it), and the session stops before the round that would pass the budget, which
the page says.

The relay is paused between rounds (the admin API's ``pause-after-round``) so each round's page can be read before
the next one starts: the relay pauses itself once the round has merged. (A pause sent from outside once the round's
units were out raced the next round on a loaded machine: that one could merge first, and its page went unread.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_helpers import (
    ARTIFACTS,
    BOOT_SECONDS,
    REPO_ROOT,
    admin,
    close_pages,
    recorded_results,
    relay_options,
    session_status,
    start_relay,
    stop,
    wait_for_status,
)
from playwright.sync_api import Browser, Page

from runtime import wire
from server.browser.peers import join_url
from server.harness.serve_command import ServeCommand
from server.session import accountant
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CSV_TASK = REPO_ROOT / "examples" / "csv_task.py"
DATA = REPO_ROOT / "examples" / "data" / "csv"
Z, DELTA = 2.0, 1e-6
# 2 units a pass, 4 passes, k = 2: 4 rounds planned; every volunteer may be in every round, so the budget (between
# 2 and 3 rounds' epsilon) stops the session once some page has been in 2 rounds and a third would pass it.
BUDGET = (accountant.epsilon(Z, 2, DELTA) + accountant.epsilon(Z, 3, DELTA)) / 2
CSV_SETTINGS = {"validation_file": str(DATA / "validation.csv"), "units": 2}


def page_text(page: Page, selector: str, wanted: str, tries: int = 200) -> str:
    """The element's text once it holds ``wanted`` (the page's event stream can trail the status a little)."""
    text = ""
    for _ in range(tries):
        text = page.inner_text(selector)
        if wanted in text:
            return text
        page.wait_for_timeout(100)
    return text


def open_csv_pages(browser: Browser, url: str, relay: Any, pages: list[Page]) -> None:
    """Pause the relay, open two pages (into ``pages``) that each choose their own CSV file, wait until both joined."""
    admin(url, "pause")
    for number in (1, 2):
        page = browser.new_context().new_page()
        page.goto(join_url(url))
        page.set_input_files("#local-files", [str(DATA / "peers" / f"peer-{number}" / "rows.csv")])
        pages.append(page)
    wait_for_status(url, lambda s: s["peers"]["joined"] >= 2, timeout_s=BOOT_SECONDS + 60, what="2 pages to join",
                    pages=pages, relay=relay)


def test_the_page_shows_epsilon_after_each_round_and_the_budget_stop(browser: Browser, tmp_path: Path) -> None:
    config = SessionConfig(participants=2, passes=4, aggregate="mean", dp_noise_multiplier=Z, dp_clip=0.05,
                           divergence_factor=1000,  # (two peers' noisy mean: not about utility)
                           dp_epsilon_budget=float(f"{BUDGET:.6f}"))
    serve = ServeCommand(task=str(CSV_TASK), task_settings=CSV_SETTINGS, session_dir=tmp_path / "session",
                         config=config, options=relay_options(min_peers=2))
    relay, url = start_relay(serve, log_name="relay-privacy-csv.log")
    pages: list[Page] = []
    shown: dict[int, str] = {}  # rounds merged -> the page's privacy line then
    try:
        open_csv_pages(browser, url, relay, pages)
        before = pages[0].inner_text("#privacy")
        for _ in range(6):  # (4 rounds planned; the budget stops it sooner)
            merged = session_status(url)["round"]
            admin(url, "pause-after-round")  # (this round runs; the relay pauses once it merged: nothing races it)
            status = wait_for_status(url, lambda s, merged=merged: s["done"] or (s["round"] > merged and s["paused"]),
                                     timeout_s=120, what="the round to merge", pages=pages, relay=relay)
            assert status["round"] == merged + 1, (merged, status["round"])
            epsilon = status["privacy"]["epsilon"]
            shown[status["round"]] = page_text(pages[0], "#privacy", f"epsilon {epsilon:.2f} at delta")
            if status["done"]:
                break
        final = status
        stopped_text = page_text(pages[0], "#session-status", "privacy budget reached")
        pages[0].screenshot(path=str(ARTIFACTS / "page-privacy-csv.png"), full_page=True)
    finally:
        close_pages(pages)
        stop(relay)

    assert "differential privacy: epsilon 0.00" in before and "if the session runs to its end" in before
    history = final["history"]
    rounds_per_unit = [entry["privacy"]["rounds_per_unit"] for entry in history]
    assert [entry["privacy"]["epsilon"] for entry in history] == \
        pytest.approx([accountant.epsilon(Z, n, DELTA) for n in rounds_per_unit])
    # Every round's epsilon was on the page once it merged, in the page's own words.
    assert sorted(shown) == list(range(1, len(history) + 1)), (sorted(shown), len(history))
    for rounds, text in shown.items():
        assert f"epsilon {history[rounds - 1]['privacy']['epsilon']:.2f} at delta 0.000001" in text, (rounds, text)
        assert f"stops before passing epsilon {BUDGET:.2f}" in text
    # The budget stopped the session before a round that would pass it, and the page said so.
    assert final["done"] and "privacy budget reached" in final["stopped"]
    assert len(history) in (2, 3) and max(rounds_per_unit) == 2 and history[-1]["privacy"]["epsilon"] <= BUDGET
    assert history[-1]["events"][-1]["type"] == "privacy_budget"
    assert "privacy budget reached" in stopped_text


def test_a_volunteer_adds_noise_of_their_own_and_sees_their_epsilon(browser: Browser, tmp_path: Path) -> None:
    """Local DP: the first page chooses noise 2 before training; its uploads carry the noise (and say so in their
    header), the other page's do not; the page shows the epsilon of its own uploads, as dp-accounting gives it."""
    session_dir = tmp_path / "session"
    config = SessionConfig(participants=2, passes=2, divergence_factor=1000)  # (noise of 2 per weight)
    # No backups: with them, a page slower than the other (a loaded machine) had each of its units backed up by the
    # other page, whose copy won, and none of the noisy page's uploads was stored (a fresh-clone run saw this; holding
    # the noisy page's uploads 4 s in Playwright did it every time).
    serve = ServeCommand(task=str(CSV_TASK), task_settings=CSV_SETTINGS, session_dir=session_dir, config=config,
                         options=relay_options(min_peers=2, backup_after=None))
    relay, url = start_relay(serve, log_name="relay-local-dp-csv.log")
    pages: list[Page] = []
    try:
        open_csv_pages(browser, url, relay, pages)
        offered = page_text(pages[0], "#local-dp", "noise 2")
        pages[0].select_option("#local-dp", "2")
        chose = page_text(pages[0], "#local-dp-note", "on: each update is clipped")
        admin(url, "resume")
        final = wait_for_status(url, lambda s: s["done"], timeout_s=240, what="the session to finish", pages=pages,
                                relay=relay)
        records = recorded_results(session_dir)
        noisy = {r.peer_id for r in records if "local_dp" in wire.decode(r.message)[0].meta}
        assert len(noisy) == 1, (noisy, final["participants"], [entry.get("events") for entry in final["history"]])
        # Every upload counts (a backup's copy that was compared and not merged sent the person's data all the same):
        # the relay's count of the peer's results, accepted or refused, which is what the page reads too.
        stored = sum(1 for r in records if r.peer_id in noisy)
        sent = sum(p["units_done"] + p["refusals"] for p in final["participants"]
                   if any(peer_id.startswith(p["peer"]) for peer_id in noisy))
        epsilon = accountant.epsilon(2.0, sent, DELTA)
        note = page_text(pages[0], "#local-dp-note", f"your epsilon is {epsilon:.2f} after your {sent} upload")
    finally:
        close_pages(pages)
        stop(relay)

    assert "noise 0.5" in offered and "noise 4" in offered and "epsilon is 0 so far" in chose
    assert f"your epsilon is {epsilon:.2f} after your {sent} upload" in note, note
    assert 1 <= stored <= sent
    assert final["done"] and final["stopped"] is None and final["privacy"]["enabled"] is False
    assert len(final["history"]) == 2
    headers = {r.peer_id: wire.decode(r.message)[0] for r in records}
    for peer_id, header in headers.items():
        if peer_id in noisy:
            assert header.meta["local_dp"] == {"noise_multiplier": 2.0, "clip": 1.0} and set(header.metrics) == \
                {"seconds"}
        else:
            assert "local_dp" not in header.meta and "train_loss" in header.metrics
