"""Pages behind one address (a classroom's NAT) join in turn: three Chromium pages ask to join at the same moment
(their join requests are held by Playwright until all three have asked, then let go together) on a relay that
admits 1 join at once and then one every 2 s per address. One gets in; the two others are refused ``429
join_rate`` once each, with a ticket, and their workers come back after ``Retry-After`` showing it, so each is
admitted at its turn instead of queueing again; then the three train the session to its end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser_helpers import (
    ARITH_SETTINGS,
    BOOT_SECONDS,
    check_pages,
    close_pages,
    relay_options,
    start_relay,
    stop,
    wait_for_status,
)
from playwright.sync_api import Browser, Page, Route

from server.browser.peers import join_url
from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGES = 3


class JoinGate:
    """A ``page.route`` handler for ``POST /api/join``: holds the joins until ``PAGES`` have asked, then lets every
    one through; records each join's body."""

    def __init__(self) -> None:
        self.held: list[Route] = []
        self.bodies: list[dict] = []
        self.open = False

    def __call__(self, route: Route) -> None:
        self.bodies.append(json.loads(route.request.post_data or "{}"))
        if self.open:
            route.continue_()
        else:
            self.held.append(route)

    def release(self) -> None:
        self.open = True
        for route in self.held:
            route.continue_()


def test_pages_behind_one_address_join_in_turn_with_their_tickets(browser: Browser, tmp_path: Path) -> None:
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=PAGES, passes=1),
                         options=relay_options(join_burst=1, join_rate=0.5, min_peers=PAGES))
    relay, url = start_relay(serve, log_name="relay-join-in-turn.log")
    gate, pages = JoinGate(), list[Page]()
    try:
        for _ in range(PAGES):
            page = browser.new_context().new_page()
            page.route("**/api/join", gate)
            page.goto(join_url(url))
            pages.append(page)
        for _ in range(BOOT_SECONDS * 10):  # (bounded: the pages' boots; the handler runs while a page waits)
            if len(gate.held) == PAGES:
                break
            check_pages(pages)
            pages[0].wait_for_timeout(100)
        assert len(gate.held) == PAGES, f"{len(gate.held)} of {PAGES} pages asked to join"
        gate.release()
        joined = wait_for_status(url, lambda s: s["peers"]["joined"] >= PAGES, timeout_s=120,
                                 what="every page to join", pages=pages, relay=relay)
        final = wait_for_status(url, lambda s: s["done"], timeout_s=600, what="the session to finish",
                                pages=pages, relay=relay)
    finally:
        close_pages(pages)
        stop(relay)
    assert joined["counters"]["refused.join_rate"] == PAGES - 1  # each page behind the first refused once, no more
    first, later = gate.bodies[:PAGES], gate.bodies[PAGES:]
    assert not any("ticket" in body for body in first), first
    tickets = [body.get("ticket", "") for body in later]
    assert len(tickets) == PAGES - 1 and all(tickets) and len(set(tickets)) == PAGES - 1, later
    assert final["peers"]["joined"] == PAGES and not final["stopped"], final["stopped"]
