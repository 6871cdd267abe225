"""Driving the real page in headless Chromium: a relay process (started through ``server.harness``), a page, Python
run inside its worker.

Used by the benchmarks that measure the runtime in Pyodide and by headless peers; tests use the same
launch options through pytest-playwright.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from server.browser.chromium import launch_options
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand

READY_SELECTOR = "body[data-state='ready'], body[data-state='failed']"
# The page's worker answers ``window.peertrain.run(code)`` only when the page was opened with ``?test=1``.
TEST_FLAG = "test"


def with_test_flag(url: str) -> str:
    """``url`` with ``test=1`` added to its query (other parameters kept): a page whose run hook answers."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query[TEST_FLAG] = "1"
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), parts.fragment))


# How long a relay may take to print its URL and answer /healthz. It builds the session's package first (a custom
# task's tokenizer, a local task's files): seconds alone, but past 60 s under a loaded CI machine (seen here, three
# browser tests at once at load 13). An event ends the wait; this only bounds it.
RELAY_START_SECONDS = 240


def launch_relay(serve: ServeCommand, *, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``peertrain serve --port 0`` (``server.harness.RelayProcess``) with its output in ``log_path``;
    returns the process, once ``/healthz`` answers, and the URL it printed. The caller stops the process."""
    relay = RelayProcess(serve, log=log_path, start_timeout_s=RELAY_START_SECONDS)
    relay.start()
    assert relay.process is not None
    return relay.process, relay.page_url


@contextmanager
def relay_process(serve: ServeCommand, *, log_path: Path | None = None) -> Iterator[str]:
    """Run ``peertrain serve --port 0`` in a child process; yields the URL it printed (stopped after)."""
    with RelayProcess(serve, log=log_path, start_timeout_s=RELAY_START_SECONDS) as relay:
        yield relay.page_url


@contextmanager
def worker_page(url: str, *, timeout_s: float = 120) -> Iterator[object]:
    """A headless Chromium page at ``url`` (opened for testing, so ``run_in_worker`` is answered) whose worker has
    booted the runtime; yields the Playwright page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**launch_options())
        try:
            page = browser.new_page()
            page.goto(with_test_flag(url))
            page.locator(READY_SELECTOR).wait_for(timeout=timeout_s * 1000)
            if page.evaluate("window.peertrain.state") != "ready":
                raise RuntimeError(f"the page failed to boot: {page.inner_text('#error')}")
            yield page
        finally:
            browser.close()


def run_in_worker(page: object, code: str, *, timeout_s: float = 600) -> str:
    """Run Python source in the page's worker; returns the value of its last expression as a string.

    The page must have been opened at ``with_test_flag(...)`` (``worker_page`` does); otherwise the worker refuses."""
    page.set_default_timeout(timeout_s * 1000)  # type: ignore[attr-defined]
    return str(page.evaluate("(code) => window.peertrain.run(code)", code))  # type: ignore[attr-defined]
