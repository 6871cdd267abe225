"""``peertrain bench hidden-tab``: units per minute of one page while its tab is hidden, beside visible.

A volunteer leaves the page in a background tab. Chromium throttles a hidden page's own timers (to one wake-up a
second, and chained timers to one a minute after five minutes hidden: "intensive wake-up throttling") and may lower its
renderer's priority; the page trains in its dedicated workers, whose timers and fetches are not throttled so, and
keeps its own timers out of the training path (``web/src/guest.js``; the CPU share's rests are the workers' own
timers: ``--share 50`` measures them). This bench measures what is left: one relay (``peertrain
serve`` in its own process; bytetext by default, asynchronous merging so a worker never waits for a round's last
unit, validation only every 1,000 merges) and one headless Chromium page at ``?join=1`` with the page's default
settings (the cores it gives by default, a CPU share of 100 %). Units are counted at the relay (its accepted
results) in three phases of ``--units`` each, from a unit boundary: visible, hidden (a blank tab opened in front of
it in the same window; the page's ``document.visibilityState`` is checked to be "hidden", and ``--hidden-after``
seconds pass before counting, 330 to be past intensive throttling's five minutes), visible again. The visible
figure is its two phases together; hidden beside it is the ratio. Beside them: how late a 50 ms ``setTimeout`` of
the page's main thread fires, visible and hidden (the throttling the training path stays out of).

Chromium is driven over its DevTools pipe (``--remote-debugging-pipe``: CDP messages ending in a NUL byte, read on
fd 3 and written on fd 4), not through Playwright: Playwright keeps every page it drives visible (its focus
emulation holds the page as if it were being captured), so no tab in front and no minimized window ever makes a
Playwright page "hidden", headless or not.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from server.browser.chromium import LAUNCH_ARGS, chromium_path
from server.browser.peers import join_url
from server.cli.options import parse_sets
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.client import RelayClient
from server.relay.options import RelayOptions
from server.session.config import SessionConfig

# How late a 50 ms timer of the page's main thread fires (ms): 0 when on time.
TIMER_LAG = """new Promise((resolve) => { const start = performance.now();
  setTimeout(() => resolve(performance.now() - start - 50), 50); })"""
PROBE = """JSON.stringify({ state: document.body.dataset.state, error: document.getElementById('error').textContent,
  visibility: document.visibilityState, units: window.peertrain.unitsDone })"""


class CDPError(RuntimeError):
    """Chromium answered a DevTools call with an error, or its pipe closed."""


class PipeBrowser:
    """Headless Chromium driven over ``--remote-debugging-pipe``: ``call`` sends one CDP command and returns its
    result (events and other answers that come first are skipped: this client enables no domain that streams)."""

    def __init__(self, profile: Path) -> None:
        browser_reads, to_browser = os.pipe()  # (Chromium reads its commands on fd 3...)
        from_browser, browser_writes = os.pipe()  # (...and writes its answers and events on fd 4)

        def onto_fds_3_and_4() -> None:  # (in the child, before exec: where Chromium looks for the pipe's ends)
            # Through fds above 10 first, so that neither end is overwritten by the other's dup2 onto 3 or 4.
            high = [fcntl.fcntl(end, fcntl.F_DUPFD, 10) for end in (browser_reads, browser_writes)]
            for fd, end in zip((3, 4), high, strict=True):
                os.dup2(end, fd)  # (inheritable: kept across exec)
                os.close(end)

        command = [chromium_path(), "--headless", *LAUNCH_ARGS, f"--user-data-dir={profile}",
                   "--remote-debugging-pipe", "about:blank"]
        # (close_fds would close 3 and 4 after preexec_fn; Python opens its own files non-inheritable, PEP 446, so
        # only the two ends reach Chromium)
        self.process = subprocess.Popen(command, preexec_fn=onto_fds_3_and_4, close_fds=False,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(browser_reads)
        os.close(browser_writes)
        self._out = os.fdopen(to_browser, "wb", buffering=0)
        self._in = os.fdopen(from_browser, "rb", buffering=0)
        self._buffer = b""
        self._next_id = 0

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise CDPError(f"{method}: {answer['error']}")
                return dict(answer.get("result", {}))

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = self._in.read(1 << 16)
            if not chunk:
                raise CDPError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def close(self) -> None:
        for stream in (self._out, self._in):
            stream.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


class Tab:
    """One page target of a ``PipeBrowser``, attached (flat sessions)."""

    def __init__(self, browser: PipeBrowser, target_id: str) -> None:
        self.browser, self.target_id = browser, target_id
        self.session = browser.call("Target.attachToTarget", {"targetId": target_id, "flatten": True})["sessionId"]

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` (a promise is awaited) as JSON gives it."""
        answer = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, self.session)
        if "exceptionDetails" in answer:
            raise CDPError(f"{expression[:60]}...: {answer['exceptionDetails'].get('text')}")
        return answer["result"].get("value")


@dataclass
class Phase:
    name: str
    visibility: str  # document.visibilityState through the phase
    units: int
    seconds: float
    timer_lag_ms: float  # how late a 50 ms timer of the page's main thread fired

    @property
    def per_minute(self) -> float:
        return 60.0 * self.units / self.seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="bytetext", help="the session's task (default bytetext)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="a task setting for the session (repeatable)")
    parser.add_argument("--units", type=int, default=12, help="units counted in each phase (default 12)")
    parser.add_argument("--hidden-after", type=float, default=0.0,
                        help="seconds the tab stays hidden before its units are counted (default 0; 330 measures "
                             "past intensive throttling's five minutes)")
    parser.add_argument("--share", type=int, default=100,
                        help="the page's CPU share in percent (?share=; default 100, the page's default): a share "
                             "below 100 times the workers' rests too")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the bench may take (default 1800)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")


def run(args: argparse.Namespace) -> int:
    if args.units < 1 or args.hidden_after < 0 or args.share not in range(10, 101, 10):
        print("peertrain bench hidden-tab: --units must be at least 1, --hidden-after at least 0 and --share one of "
              "10, 20, ..., 100")
        return 2
    with tempfile.TemporaryDirectory(prefix="peertrain-hidden-tab-") as folder:
        phases = measure(Path(folder), args)
    figures = print_table(args.task, phases, args.hidden_after, args.share)
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2))
    return 0


def measure(folder: Path, args: argparse.Namespace) -> list[Phase]:
    serve = ServeCommand(task=args.task, task_settings=parse_sets(args.settings), fresh=True,
                         session_dir=folder / "session",
                         config=SessionConfig(participants=3, mode="async", validate_every=1000, passes=1000),
                         options=RelayOptions(admin_token="", verify=False))  # (replays would share the cores measured)
    deadline = time.monotonic() + args.timeout
    with RelayProcess(serve, log=folder / "relay.log") as relay:
        client = relay.client()
        browser = PipeBrowser(folder / "profile")
        try:
            first = next(t for t in browser.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
            page = Tab(browser, first["targetId"])
            url = join_url(relay.page_url) + (f"&share={args.share}" if args.share != 100 else "")
            browser.call("Page.navigate", {"url": url}, page.session)
            wait_page(page, lambda seen: seen["units"] >= 1, deadline, "the page's first unit (its boot)")
            phases = [count(page, client, "visible", args.units, deadline)]
            cover = browser.call("Target.createTarget", {"url": "about:blank", "newWindow": False})["targetId"]
            wait_page(page, lambda seen: seen["visibility"] == "hidden", deadline, "the page to be hidden")
            hidden_until = time.monotonic() + args.hidden_after
            while time.monotonic() < hidden_until:
                wait_page(page, lambda seen: True, deadline, "the hidden wait")
                time.sleep(min(5.0, max(0.0, hidden_until - time.monotonic())))
            phases.append(count(page, client, "hidden", args.units, deadline))
            browser.call("Target.closeTarget", {"targetId": cover})
            browser.call("Target.activateTarget", {"targetId": first["targetId"]})
            wait_page(page, lambda seen: seen["visibility"] == "visible", deadline, "the page to be visible again")
            phases.append(count(page, client, "visible again", args.units, deadline))
            return phases
        finally:
            browser.close()


def accepted(client: RelayClient) -> int:
    return int(client.status()["counters"].get("results_accepted", 0))


def count(page: Tab, client: RelayClient, name: str, units: int, deadline: float) -> Phase:
    """``units`` accepted results from the next unit boundary on, and the page's timer lag meanwhile."""
    lag = float(page.evaluate(TIMER_LAG))
    start = accepted(client)
    while accepted(client) == start:  # (from a unit boundary: the first unit of the phase is wholly in it)
        check(page, deadline, f"a unit to start the {name} phase")
        time.sleep(0.1)
    started, start = time.monotonic(), accepted(client)
    visibility = json.loads(page.evaluate(PROBE))["visibility"]
    while accepted(client) < start + units:
        seen = check(page, deadline, f"{units} units ({name})")
        if seen["visibility"] != visibility:
            raise RuntimeError(f"the page became {seen['visibility']} during the {name} phase")
        time.sleep(0.1)
    seconds = time.monotonic() - started
    lag = max(lag, float(page.evaluate(TIMER_LAG)))
    return Phase(name, visibility, accepted(client) - start, seconds, lag)


def check(page: Tab, deadline: float, what: str) -> dict[str, Any]:
    seen: dict[str, Any] = json.loads(page.evaluate(PROBE))
    if seen["state"] == "failed":
        raise RuntimeError(f"the page failed: {seen['error']}")
    if time.monotonic() > deadline:
        raise RuntimeError(f"timed out waiting for {what}; the page: {seen}")
    return seen


def wait_page(page: Tab, done: Any, deadline: float, what: str) -> dict[str, Any]:
    """Poll the page until ``done(probe)``; fails with the page's state past ``deadline``."""
    while True:
        try:
            seen = check(page, deadline, what)
        except CDPError:  # (the page is still navigating: no window.peertrain yet)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)
            continue
        if done(seen):
            return seen
        time.sleep(0.25)


def print_table(task: str, phases: list[Phase], hidden_after: float, share: int) -> dict[str, Any]:
    visible = [phase for phase in phases if phase.visibility == "visible"]
    hidden = [phase for phase in phases if phase.visibility == "hidden"]
    per_minute = {name: 60.0 * sum(p.units for p in group) / sum(p.seconds for p in group)
                  for name, group in (("visible", visible), ("hidden", hidden))}
    ratio = per_minute["hidden"] / per_minute["visible"]
    settings = "its default settings" if share == 100 else f"a CPU share of {share} %"
    print(f"\n{task}: one page at {settings}, units per minute with its tab visible and hidden"
          f" (counted after {hidden_after:.0f} s hidden)")
    print("| phase | visibilityState | units | seconds | units / minute | a 50 ms main-thread timer's lag |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for phase in phases:
        print(f"| {phase.name} | {phase.visibility} | {phase.units} | {phase.seconds:.1f} | {phase.per_minute:.2f} "
              f"| {phase.timer_lag_ms:.0f} ms |")
    print(f"\nhidden / visible: {per_minute['hidden']:.2f} / {per_minute['visible']:.2f} units per minute = "
          f"**{ratio:.2f}x**")
    return {"task": task, "share": share, "hidden_after_s": hidden_after,
            "phases": [asdict(p) | {"per_minute": p.per_minute} for p in phases],
            "visible_per_minute": per_minute["visible"], "hidden_per_minute": per_minute["hidden"], "ratio": ratio}
