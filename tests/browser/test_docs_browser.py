"""The documentation site as a reader meets it: served by a running relay at /docs, its theme's scripts allowed by
the relay's policy, its search answering offline."""

from __future__ import annotations

import pytest
from browser_helpers import REPO_ROOT
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not (REPO_ROOT / "site" / "index.html").is_file(),
                                 reason="the documentation site is not built (make setup builds it)")]


def test_a_reader_opens_the_docs_follows_a_link_and_searches(page: Page, relay_url: str) -> None:
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    outside: list[str] = []
    page.context.on("request", lambda request: outside.append(request.url)
                    if not request.url.startswith(relay_url) and not request.url.startswith("data:") else None)
    page.goto(relay_url + "docs/")
    expect(page.locator("h1").first).to_contain_text("peertrain")
    page.get_by_role("link", name="Getting started").first.click()
    expect(page).to_have_url(relay_url + "docs/getting-started/")
    expect(page.locator("h1").first).to_contain_text("Getting started")
    page.locator("label.md-search__icon, .md-search__input").first.click()  # the search box opens on a click
    # The index is fetched from the relay and built in the theme's worker; a query typed before it is ready is not run
    # again once it is (a loaded fresh-clone run typed too early), so the reader types it again until it answers.
    box, results = page.locator("input.md-search__input"), page.locator(".md-search-result__item")
    for _ in range(30):  # (bounded: 30 tries of 2 s)
        box.fill("")
        box.press_sequentially("centered clipping")
        try:
            expect(results.first).to_be_visible(timeout=2_000)
            break
        except AssertionError:
            continue
    expect(results.first).to_be_visible(timeout=1_000)
    assert results.count() > 0
    page.goto(relay_url + "docs/api/")
    expect(page.locator("article h3", has_text="POST /api/result").first).to_be_visible()
    assert problems == [], problems  # a script the policy refused would be a console error
    assert outside == [], outside
