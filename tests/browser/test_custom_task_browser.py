"""A custom task module given as a file reaches browsers as a wheel built by the relay, and trains there."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import REPO_ROOT, relay_options, start_relay, wait_until_done
from playwright.sync_api import Page

from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


# (the task file, its session, the rounds and units that makes): the docs' example and the README's
EXAMPLES = {"majority_task": (SessionConfig(participants=2, passes=1), 4, 8),
            "circle_task": (SessionConfig(participants=3, passes=2), 4, 12)}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_file_task_is_installed_from_the_relay_and_learns(page: Page, tmp_path: Path, name: str) -> None:
    config, rounds, units = EXAMPLES[name]
    serve = ServeCommand(task=str(REPO_ROOT / "examples" / f"{name}.py"), session_dir=tmp_path / "session",
                         config=config, options=relay_options(min_peers=1))
    process, url = start_relay(serve, log_name="relay-custom-task.log")
    try:
        requested: list[str] = []
        page.context.on("request", lambda request: requested.append(request.url))  # the worker's too
        page.goto(url + "?join=1")
        status = wait_until_done(page, url, timeout_s=240)
        assert status["done"], status
        assert any(f"peertrain_task_{name}" in u for u in requested), "the task wheel was not installed"
        history = status["history"]
        assert len(history) == status["num_rounds"] == rounds
        assert history[-1]["metrics"]["accuracy"] > 0.95 > status["initial_metrics"]["accuracy"]
        assert page.evaluate("window.peertrain.unitsDone") == units
        assert all(sample["ok"] is not None for sample in status["samples"])
    finally:
        process.terminate()
        process.wait(timeout=10)
