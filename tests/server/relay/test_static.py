"""The relay serves the page, Pyodide and the wheels, and nothing else."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from server.relay.app import RelayPaths, create_app


@pytest.fixture()
def client(tmp_path) -> TestClient:
    web = tmp_path / "web"
    (web / "src").mkdir(parents=True)
    (web / "index.html").write_text("<!doctype html><title>t</title>")
    (web / "src" / "main.js").write_text("console.log(1)")
    (web / "src" / ".secret.js").write_text("hidden")
    core = web / "node_modules" / "pyodide"
    core.mkdir(parents=True)
    (core / "pyodide.asm.wasm").write_bytes(b"\0asm\x01\0\0\0")
    (core / "pyodide.js").write_text("// core")
    (core / "package.json").write_text("{}")
    (core / "pyodide-lock.json").write_text('{"official": true}')
    chart = web / "node_modules" / "chart.js" / "dist"
    chart.mkdir(parents=True)
    (chart / "chart.umd.js").write_text("// chart")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pyodide-lock.json").write_text('{"packages": {"peertrain-runtime": {"version": "9.9"}}}')
    (wheels / "peertrain_runtime-0.1.0-cp312-none-any.whl").write_bytes(b"PK\x03\x04")
    (tmp_path / "pyproject.toml").write_text("secret")
    return TestClient(create_app(RelayPaths(web=web, wheels=wheels)))


@pytest.mark.parametrize(
    ("path", "content_type", "cache"),
    [
        ("/", "text/html; charset=utf-8", "no-cache"),
        ("/src/main.js", "text/javascript; charset=utf-8", "no-cache"),
        ("/pyodide/pyodide.asm.wasm", "application/wasm", "immutable"),
        ("/pyodide/pyodide.js", "text/javascript; charset=utf-8", "immutable"),
        ("/pyodide/pyodide-lock.json", "application/json", "no-cache"),
        ("/wheels/peertrain_runtime-0.1.0-cp312-none-any.whl", "application/zip", "no-cache"),
        ("/vendor/chart.umd.js", "text/javascript; charset=utf-8", "no-cache"),
    ],
)
def test_serves_with_content_type_and_cache_headers(client: TestClient, path: str, content_type: str,
                                                     cache: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == content_type
    assert cache in response.headers["cache-control"]
    assert "wasm-unsafe-eval" in response.headers["content-security-policy"]
    assert "unsafe-eval'" not in response.headers["content-security-policy"].replace("wasm-unsafe-eval", "")
    # every asset the page loads isolates it: SharedArrayBuffer (WebAssembly threads) needs both
    assert response.headers["cross-origin-opener-policy"] == "same-origin"
    assert response.headers["cross-origin-embedder-policy"] == "require-corp"


def test_lock_file_comes_from_wheels_not_the_official_one(client: TestClient) -> None:
    assert client.get("/pyodide/pyodide-lock.json").json() == {"packages": {"peertrain-runtime": {"version": "9.9"}}}


@pytest.mark.parametrize(
    "path",
    [
        "/../pyproject.toml",
        "/src/../../pyproject.toml",
        "/src/..%2f..%2fpyproject.toml",
        "/src/%2e%2e/%2e%2e/pyproject.toml",
        "/pyodide/..%2F..%2F..%2Fpyproject.toml",
        "/wheels/../pyproject.toml",
        "/src/.secret.js",
        "/src/",
        "/pyodide/",
        "/wheels/",
        "/pyodide/package.json",
        "/vendor/../package.json",
        "/vendor/chart.js",
        "/src//etc/passwd",
        "/src/%00main.js",
    ],
)
def test_no_traversal_no_listing_no_hidden_files(client: TestClient, path: str) -> None:
    # Raw paths: the test client must not normalise them before they reach the relay.
    response = client.request("GET", path)
    assert response.status_code == 404, (path, response.text)
    assert "secret" not in response.text


def test_healthz_reports_versions_and_missing_setup(client: TestClient, tmp_path) -> None:
    assert client.get("/healthz").json() == {"ok": True, "problems": [], "runtime_version": "9.9"}
    bare = TestClient(create_app(RelayPaths(web=tmp_path / "nothing", wheels=tmp_path / "none")))
    response = bare.get("/healthz")
    assert response.status_code == 503
    assert any("make setup" in problem for problem in response.json()["problems"])


@pytest.mark.parametrize("path", ["/", "/src/main.js", "/pyodide/pyodide-lock.json",
                                  "/wheels/peertrain_runtime-0.1.0-cp312-none-any.whl", "/pyodide/pyodide.js"])
def test_a_file_the_browser_holds_is_revalidated_for_a_304_without_its_bytes(client: TestClient, path: str) -> None:
    first = client.get(path)
    etag, modified = first.headers["etag"], first.headers["last-modified"]
    again = client.get(path, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == etag and again.headers["cache-control"] == first.headers["cache-control"]
    assert client.get(path, headers={"If-Modified-Since": modified}).status_code == 304
    changed = client.get(path, headers={"If-None-Match": '"another"'})
    assert changed.status_code == 200 and changed.content == first.content
