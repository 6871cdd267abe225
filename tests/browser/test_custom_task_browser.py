"""A custom task module given as a file reaches browsers as a wheel built by the relay, and trains there."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import REPO_ROOT, relay_options, start_relay, wait_until_done
from playwright.sync_api import Page

from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_file_task_is_installed_from_the_relay_and_learns(page: Page, tmp_path: Path) -> None:
    serve = ServeCommand(task=str(REPO_ROOT / "examples" / "majority_task.py"), session_dir=tmp_path / "session",
                         config=SessionConfig(participants=2, passes=1), options=relay_options(min_peers=1))
    process, url = start_relay(serve, log_name="relay-custom-task.log")
    try:
        requested: list[str] = []
        page.context.on("request", lambda request: requested.append(request.url))  # the worker's too
        page.goto(url + "?join=1")
        status = wait_until_done(page, url, timeout_s=240)
        assert status["done"], status
        assert any("peertrain_task_majority_task" in u for u in requested), "the task wheel was not installed"
        history = status["history"]
        assert len(history) == status["num_rounds"] == 4
        assert history[-1]["metrics"]["accuracy"] > 0.95 > status["initial_metrics"]["accuracy"]
        assert page.evaluate("window.peertrain.unitsDone") == 8
        assert all(sample["ok"] is not None for sample in status["samples"])
    finally:
        process.terminate()
        process.wait(timeout=10)
