"""bytetext, verified by replays on the browser's own engine: a free-riding page is banned, the honest pages never.

Three Chromium pages train a small bytetext session, relay as shipped (host replays on Pyodide under Node, int8
updates). Playwright rewrites one page's ``POST /api/result`` in flight to a free-rider's (the global weights back:
an update of zeros). Adam turns last-bit differences between a browser and native numpy into whole steps, so a
native replay could not judge bytetext; a replay on the browser's engine gives the honest pages' bytes exactly, so
every honest result passes bit for bit, the free-rider's first checked result fails, and the session finishes.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from browser_helpers import ADMIN_TOKEN, close_pages, relay_options, start_relay, stop, wait_for_status
from playwright.sync_api import Browser, Page
from poisoning import Poisoner, open_pages

from runtime.codec import Codec
from server.browser_assets.engines import pyodide_missing
from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(pyodide_missing() is not None, reason=f"no Pyodide under Node: {pyodide_missing()}")]

# 9 chunks of the built-in corpus, 3 a round: 3 rounds; 4 Adam steps of 8 windows a unit (about 2 s in a page)
TEXT_SETTINGS = {"chunks": 9, "steps": 4, "batch_size": 8, "validation_windows": 32}


def free_ride(global_weights: np.ndarray, result: np.ndarray) -> np.ndarray:
    return global_weights.copy()


def test_a_free_riding_page_is_banned_by_a_bit_for_bit_replay_and_no_honest_page_is(browser: Browser,
                                                                                     tmp_path: Path) -> None:
    # No backups: the intercepted page's units must not be raced.
    serve = ServeCommand(task="bytetext", task_settings=TEXT_SETTINGS, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=3, passes=1),
                         options=relay_options(min_peers=1, backup_after=None))
    relay, url = start_relay(serve, log_name="relay-free-rider.log")
    poisoner = Poisoner(url, poison=free_ride, codec=Codec.from_json({"name": "int8"}))
    pages: list[Page] = []
    try:
        assert httpx.get(url + "api/task", timeout=10).json().get("devices") == ["cpu"]
        open_pages(browser, url, 3, poisoner, pages, relay)
        final = wait_for_status(url, lambda s: s["done"], timeout_s=600, what="the session to finish",
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
    seen = f"free rides {poisoner.poisoned}, passed on {poisoner.passed}, counters {counters}, pages {banned_text}"
    assert poisoner.poisoned and counters["peers_banned"] == 1, seen
    banned = [peer for peer in listing if peer["banned"]]
    assert len(banned) == 1 and "it must be identical" in banned[0]["ban_reason"], listing
    assert banned_text[0] and "banned" in banned_text[0] and banned_text[1:] == [None, None], seen
    identical = [row for row in audit if "identical bits" in (row["verification"] or "")]
    assert len(identical) >= 2 and banned[0]["peer_id"] not in {row["peer_id"] for row in audit}, audit
    assert "replays_failed_on_host" not in counters and final["round"] == final["num_rounds"], seen
