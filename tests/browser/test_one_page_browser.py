"""A person trying peertrain alone: the default ``peertrain serve`` (k = 3, no --min-peers) with one page open
finishes its session; that page trains every unit of every round in turn and says there is no start gate. With
``--codec int8`` the same page uploads every result as an int8 update (a PTU2 message, under a third of the
weights' bytes), downloads every round after its first as the relay's int8 step from the weights it holds (rebuilt
in Pyodide: an update against anything but the relay's weights would be refused ``409 wrong_base``), and the session
still finishes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from browser_helpers import (
    ARITH_SETTINGS,
    BOOT_SECONDS,
    relay_options,
    session_status,
    start_relay,
    stop,
    wait_for_status,
)
from playwright.sync_api import Page, Request, Route

from runtime.weights import WeightSpec
from server.browser.peers import join_url
from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_the_default_serve_with_one_page_finishes(page: Page, tmp_path: Path, codec: str) -> None:
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=3, codec=codec))  # (serve's defaults but the codec)
    relay, url = start_relay(serve, log_name=f"relay-one-page-{codec}.log")
    uploads: list[bytes] = []
    weights_requests: list[tuple[str, bool]] = []  # (path, sent credentials)

    def seen(request: Request) -> None:
        if "/api/result" in request.url and request.method == "POST":
            uploads.append(request.post_data_buffer or b"")
        if "/api/weights" in request.url:
            weights_requests.append((request.url.split("/api/", 1)[1], "authorization" in request.all_headers()))

    page.context.on("request", seen)  # (the worker's requests too)
    try:
        page.goto(join_url(url))
        status = wait_for_status(url, lambda s: s["done"], timeout_s=BOOT_SECONDS + 600, what="the session to end",
                                 pages=[page], relay=relay)
        assert status["peers"]["needed"] == 1 and status["plan"]["participants_per_round"] == 3
        assert len(status["history"]) == status["num_rounds"] and status["waiting"] is None
        units = sum(len(entry["units"]) for entry in status["history"])
        shown = "[window.peertrain.unitsDone, document.getElementById('session-status').textContent]"
        for _ in range(120):  # (the page's stream can trail the status; the page's CSP forbids wait_for_function)
            done, line = page.evaluate(shown)
            if done == units and line.startswith("finished"):
                break
            page.wait_for_timeout(250)
        assert (done, line.split(":")[0]) == (units, "finished")  # every unit, by this one page
        assert "no start gate" in page.inner_text("#peers")
        # The relay's COOP/COEP headers isolate the page (this machine is a secure context), and it says so.
        assert page.evaluate("[window.isSecureContext, window.crossOriginIsolated]") == [True, True]
        context = page.evaluate("window.peertrain.context")
        assert (context["secure"], context["isolated"]) == (True, True) and "cross-origin isolated" in \
            page.inner_text("#versions")
        assert len(uploads) == units and not any(k.startswith("refused.") for k in status["counters"])
        assert {body[:4] for body in uploads} == {b"PTU2" if codec == "int8" else b"PTW2"}
        sent = page.evaluate("window.peertrain.bytes.sent")  # what the page tells its person it sent
        assert sent == sum(len(body) for body in uploads) and "sent" in page.inner_text("#last-unit")
        # Weights by digest, without credentials: the full weights once, then (int8) a chain of steps each round;
        # without a compressing codec the chain URL redirects to the full weights.
        counters, rounds = status["counters"], status["num_rounds"]
        assert weights_requests and not any(sent_credentials for _, sent_credentials in weights_requests)
        assert all(path.startswith("weights/") for path, _ in weights_requests), weights_requests
        chains = counters.get("weights_sent_chain", 0)
        assert (chains, counters["weights_sent_full"]) == ((rounds - 1, 1) if codec == "int8" else (0, rounds))
    finally:
        stop(relay)


def test_a_page_that_sends_weights_to_an_int8_session_stops_and_says_reload(page: Page, tmp_path: Path) -> None:
    """An out-of-date page (here: its jobs rewritten in flight to name no codec, so it sends float32 weights) is
    refused ``422 wrong_codec`` once, stops asking, and tells its person to reload, instead of training and being
    refused forever."""
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=3, codec="int8"))
    relay, url = start_relay(serve, log_name="relay-outdated-page.log")

    def without_codec(route: Route) -> None:
        response = route.fetch()
        job = response.json()
        job.pop("codec", None)
        route.fulfill(response=response, body=json.dumps(job))

    page.context.route("**/api/work*", without_codec)
    try:
        page.goto(join_url(url))
        page.locator("#error").wait_for(state="visible", timeout=(BOOT_SECONDS + 120) * 1000)
        assert "Reload the page" in page.inner_text("#error")
        status = wait_for_status(url, lambda s: s["counters"].get("refused.wrong_codec", 0) >= 1, timeout_s=30,
                                 what="the refusal", pages=[page], relay=relay)
        assert status["counters"]["refused.wrong_codec"] == 1 and status["round"] == 0
    finally:
        stop(relay)


def test_a_reloaded_page_keeps_its_topk_residual(page: Page, tmp_path: Path) -> None:
    """topk's error feedback: the page keeps its residual in IndexedDB after every upload, and a reload (a new
    worker, a new peer) starts from it instead of from zeros."""
    serve = ServeCommand(task="arith", task_settings=ARITH_SETTINGS, session_dir=tmp_path / "session",
                         config=SessionConfig(participants=1, passes=3, codec="topk", topk_fraction=0.1),
                         options=relay_options(verify=False))
    relay, url = start_relay(serve, log_name="relay-residual.log")
    try:
        page.goto(join_url(url))
        wait_for_status(url, lambda s: s["counters"].get("results_accepted", 0) >= 2, timeout_s=BOOT_SECONDS + 120,
                        what="two results", pages=[page], relay=relay)
        kept = page.evaluate("""() => new Promise((resolve, reject) => {
            const opening = indexedDB.open("peertrain", 1);
            opening.onerror = () => reject(opening.error);
            opening.onsuccess = () => {
              const store = opening.result.transaction("residuals").objectStore("residuals");
              const all = store.getAll();
              all.onsuccess = () => resolve(all.result.map((bytes) => Array.from(new Float32Array(bytes.buffer))
                .reduce((sum, value) => sum + Math.abs(value), 0)));
            };
          })""")
        assert len(kept) == 1 and kept[0] > 0  # one task's residual, not all zero
        size = WeightSpec.from_json(httpx.get(url + "api/task", timeout=30).json()["spec"]).size
        page.reload()
        restored = None
        for _ in range(4 * (BOOT_SECONDS + 60)):  # (bounded; the page's CSP forbids wait_for_function)
            restored = page.evaluate("window.peertrain.residualRestored")
            if restored:
                break
            page.wait_for_timeout(250)
        assert restored == size  # every entry of the model's residual
        counters = session_status(url)["counters"]
        # The page going away leaves the session (its lease is freed at once), so what its worker still had in
        # flight (the unit's data, or its upload) may be refused as not leased; nothing else may be.
        refused = {name for name in counters if name.startswith("refused.")}
        assert refused <= {"refused.not_leased"}, counters
        assert not refused or counters["leases_released_on_leave"] >= 1, counters
    finally:
        stop(relay)
