"""The relay serves the built documentation site at /docs, with a policy that admits only its own inline scripts."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from starlette.testclient import TestClient

from server.relay.app import RelayPaths, create_app
from server.relay.docs_site import NOT_BUILT

SCRIPT = b"__md_scope=new URL('.',location)"
PAGE = b"<html><head><script>" + SCRIPT + b"</script><script src='a.js'></script></head><body>%s</body></html>"


def client(tmp_path: Path, site: Path) -> TestClient:
    return TestClient(create_app(RelayPaths(web=tmp_path / "web", wheels=tmp_path / "wheels", docs=site)))


def test_the_site_is_served_with_its_inline_scripts_hashes(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "tasks" / "writing").mkdir(parents=True)
    (site / "index.html").write_bytes(PAGE % b"home")
    (site / "tasks" / "writing" / "index.html").write_bytes(PAGE % b"writing tasks")
    (site / "404.html").write_bytes(PAGE % b"no such page")
    (tmp_path / "secret.txt").write_text("outside")
    http = client(tmp_path, site)
    moved = http.get("/docs", follow_redirects=False)
    assert moved.status_code == 308 and moved.headers["location"] == "/docs/"
    page = http.get("/docs/tasks/writing/")
    assert page.status_code == 200 and "writing tasks" in page.text
    policies = page.headers.get_list("content-security-policy")
    digest = "'sha256-" + base64.b64encode(hashlib.sha256(SCRIPT).digest()).decode() + "'"
    assert len(policies) == 1 and f"script-src 'self' {digest};" in policies[0] and "unsafe-inline" not in policies[0]
    assert page.headers["x-content-type-options"] == "nosniff"  # the relay's other headers stay
    missing = http.get("/docs/nothing/here/")
    assert missing.status_code == 404 and "no such page" in missing.text
    for sneaky in ("/docs/../secret.txt", "/docs/%2e%2e/secret.txt", "/docs/..%2fsecret.txt"):
        assert "outside" not in http.get(sneaky).text
    assert "'self' 'wasm-unsafe-eval'" in http.get("/").headers["content-security-policy"]  # the page's own policy


def test_a_checkout_without_the_site_says_what_to_run(tmp_path: Path) -> None:
    answer = client(tmp_path, tmp_path / "site").get("/docs/")
    assert answer.status_code == 404 and answer.text == NOT_BUILT
