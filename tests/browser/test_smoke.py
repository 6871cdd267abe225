"""The page boots Pyodide in a Worker from the relay alone and imports the runtime."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page

from server.browser.launcher import with_test_flag

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_page_boots_runtime_in_worker_from_own_origin(page: Page, relay_url: str) -> None:
    requested: list[str] = []
    page.context.on("request", lambda request: requested.append(request.url))
    console_errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and console_errors.append(message.text))

    page.goto(with_test_flag(relay_url))  # opened for testing: window.peertrain.run answers
    # Selectors, not wait_for_function: the page's CSP forbids the eval that function polling needs.
    page.locator("body[data-state='ready'], body[data-state='failed']").wait_for(timeout=90_000)
    assert page.evaluate("window.peertrain.state") == "ready", page.inner_text("#error")

    versions = page.evaluate("window.peertrain.versions")
    assert versions["numpy"] == "2.0.2"
    assert versions["pyodide"] == "0.27.7"
    assert versions["python"].startswith("3.12.")
    assert versions["runtime"] == "0.1.0"
    assert versions["matmul"].startswith("WebAssembly SIMD kernel")

    # The kernel (a wasm side module in Pyodide's memory) gives numpy's own float32 sums, bit for bit.
    product = page.evaluate(
        "window.peertrain.run(`import json, numpy as np\n"
        "from runtime.backend import get_backend\n"
        "rng = np.random.default_rng(1)\n"
        "a, w = rng.standard_normal((1024, 96), np.float32), rng.standard_normal((384, 96), np.float32)\n"
        "ours = get_backend().matmul(a, w, transpose_b=True)\n"
        "json.dumps({'equal': bool(np.array_equal(ours, np.matmul(a, w.T))), 'shape': list(ours.shape)})`)"
    )
    assert json.loads(product) == {"equal": True, "shape": [1024, 384]}

    # The worker really imported both modules (not just loaded files): ask it.
    answer = page.evaluate(
        "window.peertrain.run(`import json, sys, numpy, runtime\\n"
        "json.dumps({'modules': sorted(m for m in ('numpy', 'runtime') if m in sys.modules),"
        " 'sum': int(numpy.arange(10).sum())})`)"
    )
    assert json.loads(answer) == {"modules": ["numpy", "runtime"], "sum": 45}

    origin = urlsplit(relay_url).netloc
    foreign = [url for url in requested if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != origin]
    assert requested, "no requests recorded"
    assert foreign == [], f"requests left the relay's origin: {foreign}"
    assert any(url.endswith("pyodide.asm.wasm") for url in requested)
    assert any("peertrain_runtime" in url for url in requested)
    assert not [e for e in console_errors if "Content Security Policy" in e]


def test_blas_numpy_opts_out_of_the_kernel(page: Page, relay_url: str) -> None:
    page.goto(relay_url + "?blas=numpy")
    page.locator("body[data-state='ready'], body[data-state='failed']").wait_for(timeout=90_000)
    assert page.evaluate("window.peertrain.state") == "ready", page.inner_text("#error")
    assert page.evaluate("window.peertrain.versions.matmul") == "numpy (no BLAS)"


def test_run_hook_is_refused_without_the_test_flag(page: Page, relay_url: str) -> None:
    """A page opened the way a user opens it runs no Python it is sent: the worker refuses and says why."""
    page.goto(relay_url)
    page.locator("body[data-state='ready'], body[data-state='failed']").wait_for(timeout=90_000)
    assert page.evaluate("window.peertrain.state") == "ready", page.inner_text("#error")
    outcome = page.evaluate("window.peertrain.run('1 + 1').then((value) => ({ value }), "
                            "(error) => ({ error: error.message }))")
    assert "value" not in outcome, outcome
    assert "refused" in outcome["error"] and "?test=1" in outcome["error"], outcome
    # The same page with the flag answers: the refusal is the flag's doing, not a broken hook.
    page.goto(with_test_flag(relay_url))
    page.locator("body[data-state='ready'], body[data-state='failed']").wait_for(timeout=90_000)
    assert page.evaluate("window.peertrain.run('1 + 1')") == "2"
