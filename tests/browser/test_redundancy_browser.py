"""Two Chromium pages train every unit twice (``serve --redundancy 1``): Pyodide on the same engine gives the
same bytes, so every compared copy is identical, nothing is arbitrated, nobody is banned, and exactly one
result per unit is merged."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import (
    ARITH_SETTINGS,
    close_pages,
    recorded_results,
    relay_options,
    start_relay,
    stop,
    train_to_the_end,
)
from playwright.sync_api import Browser, Page

from runtime import wire
from server.harness.serve_command import ServeCommand
from server.relay.store import open_store
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_two_honest_pyodide_copies_are_identical(browser: Browser, tmp_path: Path) -> None:
    session_dir = tmp_path / "session"
    serve = ServeCommand(task="arith", task_settings={**ARITH_SETTINGS, "chunks": 4}, session_dir=session_dir,
                         config=SessionConfig(participants=2, passes=1),
                         options=relay_options(redundancy=1.0))  # (address bans are off: both pages are 127.0.0.1)
    relay, url = start_relay(serve, log_name="relay-redundancy.log")
    pages: list[Page] = []
    try:
        final = train_to_the_end(browser, url, 2, relay, pages)
    finally:
        close_pages(pages)
        stop(relay)

    counters, rounds = final["counters"], final["num_rounds"]
    seen = f"counters {counters}, history {[e.get('redundancy') for e in final['history']]}"
    assert counters["copies_identical"] == counters["copies_handed_out"] == 2 * rounds, seen
    assert "copies_disputed" not in counters and counters.get("peers_banned", 0) == 0, seen
    assert all(entry["redundancy"] == {"compared": 2, "identical": 2} for entry in final["history"]), seen
    merged = recorded_results(session_dir)
    assert len(merged) == 2 * rounds, seen  # one result per unit, never both copies
    assert {wire.decode(r.message)[0].meta["engine"] for r in merged} == {"pyodide-numpy"}
    store = open_store(session_dir / "relay.sqlite3")
    try:
        for round_index in range(rounds):
            copies = store.copies(round_index)
            authors = {r.slot: r.peer_id for r in merged if r.round == round_index}
            assert sorted(slot for slot, _ in copies) == sorted(authors), seen
            assert all(peer != authors[slot] for slot, peer in copies), seen  # the other page trained the copy
    finally:
        store.close()
