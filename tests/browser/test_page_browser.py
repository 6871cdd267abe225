"""The page as a host and a volunteer see it: the metric selector switches series, the participants table lists
the three headless peers with their unit counts, "Try the model" answers an arithmetic prompt as the host's
model does for the same weights, the model downloads with the admin token (and without it only under
``--public-model``), and screenshots of the finished page, wide and phone-sized, are kept as artifacts."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from browser_helpers import (
    ADMIN_TOKEN,
    ARITH_SETTINGS,
    close_pages,
    relay_options,
    start_relay,
    stop,
    train_to_the_end,
    wait_js,
)
from playwright.sync_api import Browser, Page

from server.harness.serve_command import ServeCommand
from server.session import checkpoint_files as checkpoint
from server.session.config import SessionConfig
from server.session.export import exported_weights
from server.session.package import Package

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_page_shows_people_metrics_and_answers(browser: Browser, tmp_path: Path, artifacts_dir: Path) -> None:
    session_dir = tmp_path / "session"
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=session_dir,
                         config=SessionConfig(participants=3, passes=1), options=relay_options(backup_after=None))
    relay, url = start_relay(serve, log_name="relay-page.log")
    pages: list[Page] = []
    try:
        final = train_to_the_end(browser, url, 3, relay, pages)
        page = pages[0]
        # finished: the round's bar full, and where the model is (try it, download it)
        wait_js(page, "document.getElementById('session-status').textContent.startsWith('finished')", 20)
        bar = page.evaluate("[document.getElementById('round-progress').value, "
                            "document.getElementById('round-progress').max]")
        finished_next = page.inner_text("#finished-next") if page.is_visible("#finished-next") else ""
        wait_js(page, "document.querySelectorAll('#participants tbody tr').length >= 3", 20)
        # the table follows the status stream, which may come a little after the end: wait for the last units
        wait_js(page, "[...document.querySelectorAll('#participants tbody tr')].reduce((n, r) => n + "
                f"Number(r.cells[3].textContent), 0) >= {3 * final['num_rounds']}", 20)
        table = page.eval_on_selector_all("#participants tbody tr", "rows => rows.map(r => [r.dataset.peers, "
                                          "...[...r.cells].map(c => c.textContent)])")
        listing = httpx.get(url + "api/admin/peers", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            timeout=10).json()["peers"]
        # the metric selector: exact answers first, then the loss
        assert page.evaluate("window.peertrain.chartMetric") == "accuracy"
        options = page.eval_on_selector_all("#metric-select option", "o => o.map(x => x.value)")
        page.select_option("#metric-select", "val_loss")
        wait_js(page, "window.peertrain.chartMetric === 'val_loss'", 5)
        assert page.locator("#metric-name").text_content() == "val_loss"
        # Try the model, with the final weights
        page.fill("#try-prompt", "3+4=")
        page.click("#try-button")
        wait_js(page, "window.peertrain.lastAnswer !== undefined", 120)
        answer = page.evaluate("window.peertrain.lastAnswer")
        # Download: refused without the token, the file with it
        page.fill("#admin-token", "wrong")
        page.click("#download-form button")
        wait_js(page, "window.peertrain.downloaded !== undefined", 20)
        refused = page.evaluate("window.peertrain.downloaded")
        page.evaluate("window.peertrain.downloaded = undefined")
        page.fill("#admin-token", ADMIN_TOKEN)
        with page.expect_download() as downloading:
            page.click("#download-form button")
        downloaded = downloading.value.path().read_bytes()
        assert page.locator("#admin-token").input_value() == ""  # not left in the field
        unauthenticated = httpx.get(url + "api/model", timeout=10)
        page.screenshot(path=str(artifacts_dir / "page-finished.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.screenshot(path=str(artifacts_dir / "page-phone.png"), full_page=True)
        phone_overflow = page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")
    finally:
        close_pages(pages)
        stop(relay)

    assert {"accuracy", "val_loss"} <= set(options)
    assert bar[0] == bar[1] > 0 and "try it" in finished_next and "download it" in finished_next, (bar, finished_next)
    # a row per volunteer (three browser profiles: three keys), each with its page's one peer: name (an anonymous
    # handle), team, workers, units, credit, device, median unit, last seen, refused, banned
    by_id = {p["peer_id"][:8]: p for p in listing}
    assert len(table) == 3 and {row[0] for row in table} == set(by_id)
    for peers, name, team, _workers, units, credit, device, *_, banned in table:
        assert name.startswith("volunteer-") and team == "–" and device == "CPU (Pyodide)" and banned == "no"
        assert int(units) == by_id[peers]["units_done"] and float(credit) > 0  # (done: every unit settled)
    assert sum(int(row[4]) for row in table) == 3 * final["num_rounds"]
    package = Package.load(session_dir / "package")
    host = package.task.respond(checkpoint.read_latest(session_dir).weights, "3+4=")
    assert answer["round"] == final["round"] and answer["text"] == host["text"], (answer, host)
    assert refused == {"ok": False, "status": 401}
    assert downloaded[:8] and len(downloaded) > 1000
    assert unauthenticated.status_code == 401 and unauthenticated.json()["error"] == "unauthorized"
    assert not phone_overflow


def test_public_model_downloads_without_a_token(browser: Browser, tmp_path: Path) -> None:
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=3, passes=1), options=relay_options(public_model=True))
    relay, url = start_relay(serve, log_name="relay-public.log")
    page = browser.new_context().new_page()
    try:
        page.goto(url)
        page.wait_for_selector("#download-public:not([hidden])", timeout=30000)
        with page.expect_download() as downloading:
            page.click("#download-link")
        blob = downloading.value.path().read_bytes()
        assert page.locator("#download-form").is_hidden()
        response = httpx.get(url + "api/model", timeout=10)
    finally:
        page.context.close()
        stop(relay)
    # (safetensors writes its metadata in no fixed order: compare the weights, not the bytes)
    assert response.status_code == 200 and np.array_equal(exported_weights(response.content), exported_weights(blob))
