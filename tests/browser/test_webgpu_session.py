"""A peer that trains on WebGPU (``?device=webgpu``) takes part in a real relay session (CartPole)."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import relay_options, start_relay, wait_until_done
from playwright.sync_api import Page

from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_webgpu_peer_trains_units_of_a_session(page: Page, tmp_path: Path) -> None:
    # Replays on the browser's engine keep CartPole pages on the CPU, which they check bit for bit; this test is of
    # a page training on WebGPU, so the relay replays natively, which leaves CartPole unreplayed, as a session
    # without Node does.
    serve = ServeCommand(task="cartpole", task_settings={"units": 2, "episodes_per_unit": 8, "eval_episodes": 4,
                                                         "update_epochs": 2},
                         session_dir=tmp_path / "session", config=SessionConfig(participants=1, passes=1),
                         options=relay_options(min_peers=1, replay_engine="native"))
    process, url = start_relay(serve, log_name="relay-webgpu.log")
    try:
        page.goto(url + "?join=1&device=webgpu")
        status = wait_until_done(page, url, timeout_s=240)
        assert status["done"], (status["round"], page.evaluate("window.peertrain.activity"))
        device = page.evaluate("window.peertrain.device")
        assert device["chosen"] == "webgpu", device
        assert "WebGPU" in page.inner_text("#device")
        assert page.evaluate("window.peertrain.unitsDone") == 2
        assert status["counters"].get("results_accepted") == 2 and not any(
            name.startswith("refused.") for name in status["counters"])
        assert len(status["history"]) == 2
    finally:
        process.terminate()
        process.wait(timeout=10)
