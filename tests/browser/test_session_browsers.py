"""Whole sessions trained by headless browser peers against a real relay process.

Three pages train the arithmetic task for four rounds: the validation loss falls, a unit trained in a
browser matches the same unit trained natively, and replaying the relay's recorded results through a
fresh in-process ``Session`` reproduces its global weights bit for bit. A screenshot is taken mid-session.
Two peers started by ``peertrain serve --peers 2`` (the ``peertrain peers`` command) learn CartPole.

The helpers the browser tests share are in ``browser_helpers.py``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from browser_helpers import (
    ARITH_SETTINGS,
    ARTIFACTS,
    BOOT_SECONDS,
    admin,
    close_pages,
    final_checkpoint,
    fresh_session,
    open_peers,
    recorded_results,
    relay_options,
    replay,
    start_relay,
    stop,
    wait_for_status,
)
from playwright.sync_api import Browser, Page

from runtime import wire
from runtime.peer import Peer
from runtime.protocol import Job
from server.harness.serve_command import ServeCommand
from server.relay.store import StoredResult
from server.session import checkpoint_files as checkpoint
from server.session.config import SessionConfig
from server.session.package import Package

pytestmark = [pytest.mark.browser, pytest.mark.slow]

def train_natively(task_info: dict[str, Any], session_dir: Path, result: StoredResult,
                   global_weights: np.ndarray) -> np.ndarray:
    """Train the unit of ``result`` again with ``runtime.peer.Peer`` in this process, from ``global_weights``.

    ``task_info`` is what the browsers got from ``GET /api/task``.
    """
    peer = Peer(task_info)
    header = wire.WireHeader(spec=peer.spec, round=result.round, fingerprint=peer.fingerprint, num_examples=0)
    peer.set_weights(wire.encode(global_weights, header))
    session = fresh_session(session_dir)
    assignment = {a.slot: a for a in session.assignments(result.round)}[result.slot]
    unit = session.work_unit(assignment)
    package = Package.load(session_dir / "package")
    job = Job(**assignment.to_json(), kind=session.task.kind, episodes=unit.episodes, progress=unit.progress,
              lease_deadline=0.0, lease_seconds=0.0, weights_round=result.round, num_rounds=session.num_rounds,
              fingerprint=peer.fingerprint)
    message = peer.train(job, package.chunk_bytes(assignment.unit_index) if unit.data is not None else None)
    _, vector = wire.decode(message, expect_spec=peer.spec)
    return vector


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 600 and height >= 400, (width, height)
    assert len(data) > 20_000, f"{path} is only {len(data)} bytes"


def test_three_browsers_train_arithmetic(browser: Browser, tmp_path: Path, artifacts_dir: Path) -> None:
    session_dir = tmp_path / "session"
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=session_dir,
                         config=SessionConfig(participants=3, passes=2), options=relay_options())
    relay, url = start_relay(serve, log_name="relay-arith-3.log")
    pages: list[Page] = []
    try:
        pages = open_peers(browser, url, 3)
        first = wait_for_status(url, lambda s: len(s["history"]) >= 1, timeout_s=BOOT_SECONDS + 60,
                                what="the first round", pages=pages, relay=relay, poll_s=0.1)
        # Hold the session after a round so the screenshot shows a live session with a chart of 2+ points.
        admin(url, "pause")
        watched = pages[0]
        for _ in range(100):
            if (watched.evaluate("window.peertrain.chartPoints || 0") >= 2
                    and watched.locator("#peers").inner_text().startswith("3 connected")):
                break
            time.sleep(0.1)
        shot = artifacts_dir / "session-arith-3-peers.png"
        watched.screenshot(path=str(shot), full_page=True)
        peers_text = watched.locator("#peers").inner_text()
        admin(url, "resume")
        assert first["num_rounds"] == 4 and not first["done"]
        assert peers_text.startswith("3 connected"), peers_text
        assert_png(shot)

        final = wait_for_status(url, lambda s: s["done"], timeout_s=180, what="the session to finish",
                                pages=pages, relay=relay)
        units_done = [page.evaluate("window.peertrain.unitsDone") for page in pages]
        task_info = httpx.get(url + "api/task", timeout=10).json()
    finally:
        close_pages(pages)
        stop(relay)

    # Training worked: the validation loss fell, every round had its three units.
    history = final["history"]
    # Every peer's first result was replayed on the host and matched: no honest browser is ever banned.
    assert final["counters"].get("peers_banned", 0) == 0 and final["counters"].get("results_verified", 0) >= 3
    losses = [final["initial_metrics"]["val_loss"]] + [entry["metrics"]["val_loss"] for entry in history]
    assert [entry["round"] for entry in history] == [0, 1, 2, 3]
    assert losses[-1] < losses[0] - 0.1, losses
    assert all(entry["participants"] == 3 and not entry["missing"] for entry in history)
    # who trains what is first come, first served; a backup of a slow page's unit that came before the merge
    # was compared with the merged result (identical: the same engine) and counts as a unit done, not merged
    compared = sum(value for key, value in final["counters"].items()
                   if key in ("copies_identical", "copies_agreed", "copies_disputed", "copies_not_comparable"))
    assert final["counters"].get("copies_disputed", 0) == 0, final["counters"]
    assert sum(units_done) == 12 + compared, (units_done, final["counters"])

    results = recorded_results(session_dir)
    assert [(r.round, r.slot) for r in results] == [(r, s) for r in range(4) for s in range(3)]
    assert len({r.peer_id for r in results}) >= 2

    # Replaying the recorded results through the simulator's merge gives the relay's weights bit for bit.
    replayed, before = replay(session_dir, results)
    final_point = final_checkpoint(session_dir, 4)
    assert replayed.round == 4
    assert replayed.weights.dtype == final_point.weights.dtype == np.float32
    assert np.array_equal(replayed.weights, final_point.weights)
    assert [e["metrics"]["val_loss"] for e in replayed.history] == losses[1:]

    # A unit trained in a browser is the unit trained natively: round 0 from the initial weights, the last
    # round from the relay's checkpoint of the round before (the relay keeps the last two).
    previous = checkpoint.read_point(checkpoint.round_folder(session_dir, 3)).weights
    assert np.array_equal(previous, before[3])
    for result, start in ((results[0], before[0]), (results[-1], previous)):
        _, browser_vector = wire.decode(result.message)
        native = train_natively(task_info, session_dir, result, start)
        difference = float(np.max(np.abs(native.astype(np.float64) - browser_vector)))
        assert difference <= 1e-4, f"round {result.round} slot {result.slot}: browser vs native differ by {difference}"
        assert not np.array_equal(native, start), "the unit did not train"


# CartPole: 10 episode budgets of 16 episodes, 2 per round -> 5 rounds; the greedy return rises from ~10.
CARTPOLE_SETTINGS = {"units": 10, "episodes_per_unit": 16, "eval_episodes": 10, "lr": 0.03}


def test_serve_with_two_headless_peers_learns_cartpole(tmp_path: Path) -> None:
    session_dir = tmp_path / "session"
    relay, url = start_relay(ServeCommand(task="cartpole", task_settings=CARTPOLE_SETTINGS, session_dir=session_dir,
                                          config=SessionConfig(participants=2, passes=1),
                                          options=relay_options(min_peers=2), peers=2),
                             log_name="relay-cartpole-2.log")
    log_path = ARTIFACTS / "relay-cartpole-2.log"
    try:
        final = wait_for_status(url, lambda s: s["done"], timeout_s=BOOT_SECONDS + 120,
                                what="the CartPole session to finish", relay=relay)
        # `peertrain peers` (started by serve --peers) sees `done` and exits 0 after closing its browser.
        deadline = time.monotonic() + 30
        while "session done" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop(relay)
    log = log_path.read_text()
    assert "session done: all rounds complete" in log, log[-3000:]
    assert re.search(r"peer 1\b.*: Pyodide booted", log) and re.search(r"peer 2\b.*: Pyodide booted", log), log[-3000:]
    assert len(set(re.findall(r"peer \d: joined as (p-[0-9a-f]+)", log))) == 2, log[-3000:]
    # The first round waits for both pages (--min-peers 2: a page booting seconds after the other on a busy machine
    # would otherwise find the ten sub-second units all trained). Units then go first come, first served, so one
    # fast peer may train most of them while the other polls: require uploads, not a share from each page.
    assert re.search(r"peer \d \((p-[0-9a-f]+)\): \d+ units? uploaded", log), log[-3000:]

    initial = final["initial_metrics"]["greedy_return"]
    returns = [entry["metrics"]["greedy_return"] for entry in final["history"]]
    assert len(returns) == 5 and all(entry["participants"] == 2 for entry in final["history"])
    # CartPole's episodes can fork between a browser and native CPython; the relay replays them on the browser's own
    # engine (Pyodide under Node), bit for bit, and every honest page passes.
    counters = final["counters"]
    assert counters.get("peers_banned", 0) == 0 and counters.get("results_verified", 0) >= 2, counters
    assert "verification_failed" not in counters and "replays_failed_on_host" not in counters, counters
    # Policy gradient is noisy round to round; overall the greedy return must rise well above the start.
    assert returns[-1] > initial + 50, (initial, returns)
    assert np.mean(returns[len(returns) // 2:]) > 2 * initial, (initial, returns)
    results = recorded_results(session_dir)
    assert sorted(r.unit_index for r in results) == list(range(10))
    assert len({r.peer_id for r in results}) == 2
