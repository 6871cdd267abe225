"""Three Chromium pages in buffered asynchronous mode (``serve --mode async --buffer 2``): nobody waits for a
round, every unit is trained once, the host replays each page's first result (and more) on the browser's engine and
bans nobody, merges record their staleness, and the recorded arrivals replay to the relay's weights bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from browser_helpers import ARITH_SETTINGS, close_pages, relay_options, start_relay, stop, train_to_the_end
from playwright.sync_api import Browser, Page

from runtime import wire
from server.harness.serve_command import ServeCommand
from server.relay.store import open_store
from server.session import checkpoint_files as checkpoint
from server.session.buffered import Arrival, replay
from server.session.package import Package
from server.session.session import Session, SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_three_pages_train_asynchronously(browser: Browser, tmp_path: Path) -> None:
    session_dir = tmp_path / "session"
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=session_dir,
                         config=SessionConfig(participants=2, passes=2, mode="async"), options=relay_options())
    relay, url = start_relay(serve, log_name="relay-async.log")
    pages: list[Page] = []
    try:
        final = train_to_the_end(browser, url, 3, relay, pages)
        shown = pages[0].locator("#async").text_content() or ""
    finally:
        close_pages(pages)
        stop(relay)

    assert final["mode"] == "async" and final["round"] == final["num_rounds"], final
    counters = final["counters"]  # (host replays judge async results too: each page's first, at least)
    assert counters["results_verified"] >= 3 and not counters.get("verification_failed"), counters
    assert not counters.get("peers_banned"), counters
    assert "weights version" in shown, shown
    history = final["history"]
    assert all(len(entry["staleness"]) == entry["participants"] for entry in history)
    package = Package.load(session_dir / "package")
    config = SessionConfig.from_json(checkpoint.read_session_config(session_dir)["config"])
    store = open_store(session_dir / "relay.sqlite3")
    try:
        arrivals = [Arrival(seq, entry, unit, version, merge, examples, metrics, wire.decode(message)[1])
                    for seq, entry, unit, version, merge, examples, metrics, message in store.arrivals()]
    finally:
        store.close()
    fresh = Session.create(package, config)
    assert sorted(a.entry for a in arrivals) == list(range(len(fresh.plan.schedule)))  # every unit once
    replayed = replay(fresh, arrivals, exponent=config.staleness_exponent, validate_every=config.validate_every)
    stored = checkpoint.read_latest(session_dir).weights
    np.testing.assert_array_equal(replayed.weights, stored)
