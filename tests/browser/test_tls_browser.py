"""``serve --tls-cert/--tls-key``: a relay that faces the internet alone serves HTTPS; the page opened over it in
Chromium that trusts the certificate is a secure context (what WebGPU needs) and cross-origin isolated, boots
Pyodide over HTTPS and trains its session to the end. A certificate without its key, or with another key, is refused
before the relay starts."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import pytest
from browser_helpers import ADMIN_TOKEN, ARITH_SETTINGS, ARTIFACTS, BOOT_SECONDS
from nginx_proxy import certificate
from playwright.sync_api import BrowserType

from server.browser.chromium import launch_options
from server.browser.peers import join_url
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.options import RelayOptions
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_tls_relay_gives_the_page_a_secure_context_and_trains(browser_type: BrowserType, tmp_path: Path) -> None:
    issued = certificate(tmp_path)
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=tmp_path / "s",
                         config=SessionConfig(participants=2, passes=1), options=RelayOptions(admin_token=ADMIN_TOKEN),
                         tls_cert=issued.cert, tls_key=issued.key)
    relay = RelayProcess(serve, log=ARTIFACTS / "relay-tls.log",
                         verify=ssl.create_default_context(cafile=str(issued.authority)))
    relay.start()
    # Chromium trusts exactly this certificate's key (as it would a CA it knows); nothing else is relaxed.
    options = launch_options()
    browser = browser_type.launch(**{**options, "args": [*options["args"],
                                                         f"--ignore-certificate-errors-spki-list={issued.spki}"]})
    try:
        assert relay.url.startswith("https://127.0.0.1:")
        page = browser.new_page()
        page.goto(join_url(relay.page_url))
        client = relay.client()
        deadline = time.monotonic() + BOOT_SECONDS + 300
        status = client.status()
        while not status["done"] and time.monotonic() < deadline:
            assert page.evaluate("document.body.dataset.state") != "failed", page.inner_text("#error")
            page.wait_for_timeout(1000)
            status = client.status()
        assert status["done"], status
        assert page.evaluate("[location.protocol, isSecureContext, crossOriginIsolated]") == ["https:", True, True]
        assert page.evaluate("window.peertrain.context.secure") is True
        assert page.evaluate("window.peertrain.unitsDone") == sum(len(e["units"]) for e in status["history"])
    finally:
        browser.close()
        relay.close()


def test_a_certificate_needs_its_own_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli import main

    issued = certificate(tmp_path)
    cert, key = issued.cert, issued.key
    other = tmp_path / "other"
    other.mkdir()
    other_key = certificate(other).key
    assert main(["serve", "--port", "0", "--no-session", "--tls-cert", str(cert)]) == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--no-session", "--tls-cert", str(cert), "--tls-key", str(other_key)]) == 2
    assert "are not a PEM certificate and its key" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--no-session", "--tls-cert", str(tmp_path / "none.pem"),
                 "--tls-key", str(key)]) == 2
    assert "cannot read" in capsys.readouterr().err
