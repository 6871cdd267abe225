"""``serve --tls-cert/--tls-key``: a relay that faces the internet alone serves HTTPS; the page opened over it in
Chromium that trusts the certificate is a secure context (what WebGPU needs) and cross-origin isolated, boots
Pyodide over HTTPS and trains its session to the end. A certificate without its key, or with another key, is refused
before the relay starts."""

from __future__ import annotations

import base64
import hashlib
import ssl
import time
from pathlib import Path

import pytest
import trustme
from browser_helpers import ARITH_SETTINGS, ARTIFACTS, BOOT_SECONDS, task_args
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from playwright.sync_api import BrowserType

from server.browser.chromium import launch_options
from server.browser.peers import join_url
from server.harness.relay_process import RelayProcess

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def spki_sha256(pem: bytes) -> str:
    """What Chromium's --ignore-certificate-errors-spki-list takes: base64 of the sha256 of the key's SPKI."""
    key = x509.load_pem_x509_certificate(pem).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def certificate(folder: Path) -> tuple[Path, Path, Path, str]:
    """A throw-away CA's certificate for 127.0.0.1: (cert chain, key, CA file, the leaf's SPKI hash)."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, authority = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(authority))
    return cert, key, authority, spki_sha256(leaf.cert_chain_pems[0].bytes())


def test_a_tls_relay_gives_the_page_a_secure_context_and_trains(browser_type: BrowserType, tmp_path: Path) -> None:
    cert, key, authority, spki = certificate(tmp_path)
    relay = RelayProcess([*task_args("arith", ARITH_SETTINGS, "--session-dir", str(tmp_path / "s"), "-k", "2",
                                     "--passes", "1", "--tls-cert", str(cert), "--tls-key", str(key))],
                         log=ARTIFACTS / "relay-tls.log", verify=ssl.create_default_context(cafile=str(authority)))
    relay.start()
    # Chromium trusts exactly this certificate's key (as it would a CA it knows); nothing else is relaxed.
    options = launch_options()
    browser = browser_type.launch(**{**options, "args": [*options["args"],
                                                         f"--ignore-certificate-errors-spki-list={spki}"]})
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

    cert, key, _, _ = certificate(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _, other_key, _, _ = certificate(other)
    assert main(["serve", "--port", "0", "--no-session", "--tls-cert", str(cert)]) == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--no-session", "--tls-cert", str(cert), "--tls-key", str(other_key)]) == 2
    assert "are not a PEM certificate and its key" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--no-session", "--tls-cert", str(tmp_path / "none.pem"),
                 "--tls-key", str(key)]) == 2
    assert "cannot read" in capsys.readouterr().err
