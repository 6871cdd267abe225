"""A polite guest (issue 37): the volunteer's rules in "Your machine" pause and resume the page's training without
losing a unit. On battery (the Battery Status API emulated) the page pauses and resumes on charging; with "only
while left alone" it trains only once the page has had no input for the idle time and stops at the next input; a CPU
share of 50 % trains about half the units per minute of 100 %; the Pause button mid-unit uploads the unit in hand,
frees the peer's leases and, after Resume, the same peer trains the session to its end with every unit merged once.
The page leads with "Join and train" (within a phone's first screen) and remembers the settings in this browser."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import (
    ARITH_SETTINGS,
    BOOT_SECONDS,
    final_checkpoint,
    relay_options,
    session_status,
    start_relay,
    stop,
    wait_for_status,
)
from playwright.sync_api import Browser, Page

from server.browser.peers import join_url
from server.harness.serve_command import ServeCommand
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LONG_LEASE = 900.0  # seconds: a lease never runs out in these tests, only leaving frees one
SLOWER = {**ARITH_SETTINGS, "epochs": 60}  # a unit of a second or two: a pause lands mid-unit, a rest is measurable
PROBE = """() => ({ state: document.body.dataset.state, pausedFor: window.peertrain.pausedFor,
  units: window.peertrain.unitsDone, activity: window.peertrain.activity,
  joined: window.peertrain.workers.some((w) => w.joined), peerIds: window.peertrain.workers.map((w) => w.peerId),
  status: document.getElementById('guest-status').textContent })"""
# The Battery Status API as a laptop on battery gives it: an EventTarget whose chargingchange the test fires.
BATTERY = """(() => {
  const battery = new EventTarget();
  Object.assign(battery, { charging: false, level: 0.5, chargingTime: Infinity, dischargingTime: 3600 });
  window.testBattery = battery;
  const getBattery = () => Promise.resolve(battery);
  Object.defineProperty(Navigator.prototype, "getBattery", { configurable: true, value: getBattery });
})();"""


def seen(page: Page) -> dict[str, Any]:
    return dict(page.evaluate(PROBE))


def wait_page(page: Page, check: Callable[[dict[str, Any]], bool], *, what: str,
              timeout_s: float = BOOT_SECONDS) -> dict[str, Any]:
    """Poll the page until ``check`` holds (its CSP forbids wait_for_function's eval)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = seen(page)
        if state["state"] == "failed":
            pytest.fail(f"the page failed: {page.inner_text('#error')}")
        if check(state):
            return state
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; the page: {state}")
        page.wait_for_timeout(100)


def set_charging(page: Page, charging: bool) -> None:
    page.evaluate("(charging) => { window.testBattery.charging = charging;"
                  " window.testBattery.dispatchEvent(new Event('chargingchange')); }", charging)


def accepted(url: str) -> int:
    return int(session_status(url)["counters"].get("results_accepted", 0))


def serve(tmp_path: Path, settings: dict[str, Any], passes: int) -> ServeCommand:
    return ServeCommand(task="arith", task_settings=settings, session_dir=tmp_path / "session",
                        config=SessionConfig(participants=3, passes=passes),
                        options=relay_options(verify=False, lease_seconds=LONG_LEASE))


def test_on_battery_the_page_pauses_and_resumes_on_charging(browser: Browser, tmp_path: Path) -> None:
    relay, url = start_relay(serve(tmp_path, ARITH_SETTINGS, passes=200), log_name="relay-guest-battery.log")
    context = browser.new_context()
    try:
        context.add_init_script(BATTERY)
        page = context.new_page()
        page.goto(join_url(url))
        state = wait_page(page, lambda s: s["state"] == "ready" and s["pausedFor"], what="the page to boot, paused")
        assert state["pausedFor"] == "paused: on battery" and state["status"] == "paused: on battery"
        assert "on battery (50 %)" in page.inner_text("#battery-note")
        assert session_status(url)["peers"]["joined"] == 0  # no worker joined: nothing trained on battery

        set_charging(page, True)
        wait_page(page, lambda s: s["units"] >= 1, what="training once plugged in", timeout_s=120)
        assert page.inner_text("#battery-note") == "now plugged in"

        set_charging(page, False)  # unplugged again: the unit in hand is uploaded, the worker leaves
        state = wait_page(page, lambda s: s["pausedFor"] == "paused: on battery" and not s["joined"],
                          what="the pause on battery", timeout_s=120)
        status = wait_for_status(url, lambda s: s["counters"].get("peers_left", 0) == 1, timeout_s=60,
                                 what="the worker to leave", relay=relay)
        assert status["round_progress"]["leased"] == 0 and state["activity"] == "paused: on battery"
    finally:
        context.close()
        stop(relay)


def test_only_when_idle_trains_after_the_idle_time_without_input_and_input_pauses_it(
        browser: Browser, tmp_path: Path) -> None:
    idle_s = 3.0
    relay, url = start_relay(serve(tmp_path, ARITH_SETTINGS, passes=200), log_name="relay-guest-idle.log")
    page = browser.new_context().new_page()
    try:
        page.goto(join_url(url) + f"&idle-minutes={idle_s / 60}")
        wait_page(page, lambda s: s["units"] >= 1, what="training after the idle time (boot included)")
        assert page.is_checked("#idle-only")

        page.mouse.move(10, 10)  # someone uses the page: the unit in hand is uploaded and the worker leaves
        waiting = "paused: waiting for 3 s without input"
        wait_page(page, lambda s: s["pausedFor"] == waiting and not s["joined"], what="the pause on input",
                  timeout_s=60)
        before = accepted(url)
        for step in range(8):  # input keeps coming for longer than the idle time: no training meanwhile
            page.mouse.move(20 + step, 20)
            page.wait_for_timeout(500)
        last_input = time.monotonic()
        assert accepted(url) == before and seen(page)["pausedFor"]

        wait_page(page, lambda s: not s["pausedFor"], what="the idle time to pass", timeout_s=60)
        assert time.monotonic() - last_input >= idle_s - 0.5  # (observed late, never early)
        wait_page(page, lambda s: s["joined"], what="the worker to join again", timeout_s=30)
        wait_for_status(url, lambda s: s["counters"].get("results_accepted", 0) > before, timeout_s=60,
                        what="training again", relay=relay)
    finally:
        page.context.close()
        stop(relay)


def test_with_idle_detection_granted_the_whole_computers_idle_state_decides(browser: Browser, tmp_path: Path) -> None:
    """Where the volunteer granted the Idle Detection API, "only when idle" follows the computer's idle state (input
    in any window, a locked screen), which Chromium's DevTools emulate: active, the page waits whatever its own
    input; idle, it trains; active again, it pauses."""
    relay, url = start_relay(serve(tmp_path, ARITH_SETTINGS, passes=200), log_name="relay-guest-idle-detection.log")
    context = browser.new_context()
    page = context.new_page()
    try:
        idle = context.new_cdp_session(page)
        context_id = idle.send("Target.getTargetInfo")["targetInfo"]["browserContextId"]  # (this context's grant)
        browser.new_browser_cdp_session().send("Browser.grantPermissions", {
            "permissions": ["idleDetection"], "origin": url.rstrip("/"), "browserContextId": context_id})
        idle.send("Emulation.setIdleOverride", {"isUserActive": True, "isScreenUnlocked": True})
        page.goto(join_url(url) + "&idle-minutes=1")
        waiting = "paused: waiting for 1 min without input on this computer"
        wait_page(page, lambda s: s["pausedFor"] == waiting and s["state"] == "ready", what="the computer's state")
        assert accepted(url) == 0 and "without input on this computer" in page.inner_text("#guest-use")
        idle.send("Emulation.setIdleOverride", {"isUserActive": False, "isScreenUnlocked": True})
        wait_page(page, lambda s: not s["pausedFor"] and s["units"] >= 1, what="training once the computer is idle")
        idle.send("Emulation.setIdleOverride", {"isUserActive": True, "isScreenUnlocked": True})
        wait_page(page, lambda s: s["pausedFor"] == waiting and not s["joined"], what="the pause", timeout_s=60)
        before = accepted(url)
        page.wait_for_timeout(2000)
        assert accepted(url) == before
    finally:
        context.close()
        stop(relay)


def units_per_minute(page: Page, url: str, units: int) -> float:
    """Units per minute over ``units`` accepted results, counted from a unit boundary."""
    start = accepted(url)
    wait_page(page, lambda s: accepted(url) > start, what="a unit boundary", timeout_s=120)
    started, start = time.monotonic(), accepted(url)
    wait_page(page, lambda s: accepted(url) >= start + units, what=f"{units} units", timeout_s=300)
    return 60.0 * (accepted(url) - start) / (time.monotonic() - started)


def test_a_cpu_share_of_half_trains_about_half_as_many_units_per_minute(browser: Browser, tmp_path: Path) -> None:
    relay, url = start_relay(serve(tmp_path, SLOWER, passes=20), log_name="relay-guest-share.log")
    page = browser.new_context().new_page()
    try:
        page.goto(join_url(url, 1))
        wait_page(page, lambda s: s["units"] >= 1, what="the first unit (boot and warm-up behind it)")
        full = units_per_minute(page, url, 5)
        page.select_option("#share", "50")
        wait_page(page, lambda s: s["activity"].startswith("resting: CPU share 50 %"), what="a rest", timeout_s=60)
        assert seen(page)["status"].startswith("resting: CPU share 50 %")
        half = units_per_minute(page, url, 5)
        assert not session_status(url)["done"]
    finally:
        page.context.close()
        stop(relay)
    assert 0.35 <= half / full <= 0.7, (full, half)


def test_pause_mid_unit_uploads_it_frees_the_leases_and_the_same_peer_finishes_after_resume(
        browser: Browser, tmp_path: Path) -> None:
    passes = 3
    relay, url = start_relay(serve(tmp_path, SLOWER, passes=passes), log_name="relay-guest-pause.log")
    page = browser.new_context().new_page()
    try:
        page.goto(join_url(url, 1))
        state = wait_page(page, lambda s: s["units"] >= 1 and s["activity"].startswith("training"),
                          what="a unit in hand after the first")
        peer_id, units = state["peerIds"][0], state["units"]
        page.click("#pause")
        state = wait_page(page, lambda s: not s["joined"], what="the worker to leave", timeout_s=120)
        assert state["pausedFor"] == "paused by you" and state["status"] == "paused by you"
        assert page.inner_text("#pause") == "Resume"
        assert units <= state["units"] <= units + 1  # the unit in hand was uploaded, none began after the pause
        status = wait_for_status(url, lambda s: s["counters"].get("peers_left", 0) == 1, timeout_s=60,
                                 what="the peer to leave", relay=relay)
        assert status["round_progress"]["leased"] == 0 and status["peers"]["connected"] == 0 and not status["done"]

        page.click("#pause")  # Resume: the same peer (its credentials kept) trains to the end
        status = wait_for_status(url, lambda s: s["done"], timeout_s=300, what="the session to finish", relay=relay,
                                 pages=[page])
        assert seen(page)["peerIds"][0] == peer_id and status["peers"]["joined"] == 1
    finally:
        page.context.close()
        stop(relay)
    final_checkpoint(tmp_path / "session", status["num_rounds"])
    history = [json.loads(line) for line in (tmp_path / "session" / "history.jsonl").read_text().splitlines() if line]
    assert len(history) == status["num_rounds"] and all(not entry["missing"] for entry in history)
    assert sorted(unit for entry in history for unit in entry["units"]) == sorted(list(range(6)) * passes)
    assert "leases_expired" not in status["counters"]


def test_join_and_train_is_within_a_phones_first_screen(browser: Browser, relay_url: str) -> None:
    page = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    try:
        page.goto(relay_url)
        box = page.locator("#join").bounding_box()
        order = page.eval_on_selector_all("main > section", "sections => sections.map((s) => s.id)")
        overflow = page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")
    finally:
        page.context.close()
    assert box is not None and box["y"] + box["height"] < 844, box
    assert order[:2] == ["volunteer", "machine"] and order.index("you") < order.index("session"), order
    assert not overflow


def test_the_settings_survive_a_reload_and_a_visit_s_url_settings_are_not_remembered(
        browser: Browser, relay_url: str) -> None:
    page = browser.new_context().new_page()
    try:
        page.goto(relay_url)
        page.select_option("#share", "50")
        page.uncheck("#pause-on-battery")
        page.check("#idle-only")
        page.fill("#idle-minutes", "7")
        page.press("#idle-minutes", "Enter")
        page.click("#pause")
        page.reload()
        page.wait_for_selector("#guest-use:not(:has-text('…'))")
        kept = {"share": page.input_value("#share"), "battery": page.is_checked("#pause-on-battery"),
                "idle": page.is_checked("#idle-only"), "minutes": page.input_value("#idle-minutes"),
                "pause": page.inner_text("#pause"), "uses": page.inner_text("#guest-use")}
        page.goto(relay_url + "?share=20&idle-minutes=2")  # for this visit only
        visit = {"share": page.input_value("#share"), "minutes": page.input_value("#idle-minutes")}
        page.goto(relay_url)
        page.wait_for_selector("#guest-use:not(:has-text('…'))")
        after = {"share": page.input_value("#share"), "minutes": page.input_value("#idle-minutes")}
    finally:
        page.context.close()
    assert kept["share"] == "50" and not kept["battery"] and kept["idle"] and kept["minutes"] == "7", kept
    assert kept["pause"] == "Pause"  # a pause is not remembered: a page opened again trains
    assert "50 % of their time" in kept["uses"] and "trains on battery too" in kept["uses"]
    assert "only after 7 min without input" in kept["uses"], kept["uses"]
    assert visit == {"share": "20", "minutes": "2"} and after == {"share": "50", "minutes": "7"}
