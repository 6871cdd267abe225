"""``peertrain peers N --url URL``: N headless Chromium peers on a relay's page, until the session is done.

One browser, one context per peer (separate storage, so each page joins as its own peer), each page
opened at ``URL?join=1`` so it joins as soon as its worker has booted Pyodide. The session's rounds
show as a progress bar (polled from ``GET /api/session``); a peer's state changes (booted, waiting,
training a unit, uploaded, offline) print one line each. Exit status: 0 when the session is done,
1 on ``--timeout`` or when every page failed to boot, 2 when the URL serves no session, 130 on
Ctrl-C or SIGTERM. The browser is closed on every way out.

A local task's peers are given their own files (``--local-data``: a folder per peer) through the page's real file
chooser (Playwright's ``set_input_files``: the file input, or the folder input when a folder has sub-folders), so
each page reads them with the File API exactly as when a person chooses them; it joins once one file is valid.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from tqdm import tqdm

from server.browser.chromium import launch_options
from server.relay.client import RelayClient, RelayRefusal

# What each page reports; plain property reads (the page's CSP forbids eval, not CDP evaluation).
PAGE_PROBE = """() => ({
  state: document.body.dataset.state,
  kind: document.body.dataset.peer,
  activity: window.peertrain ? window.peertrain.activity : null,
  peerId: window.peertrain ? window.peertrain.peerId || null : null,
  unitsDone: window.peertrain ? window.peertrain.unitsDone : 0,
  workers: window.peertrain ? window.peertrain.workers.filter((w) => w.peerId).map((w) => w.peerId) : [],
  error: document.getElementById('error') ? document.getElementById('error').textContent : '',
  local: window.peertrain ? window.peertrain.local : null,
})"""
QUIET_KINDS_START = ("waiting", "refused", "offline", "finished", "banned")  # printed when a peer enters them


def join_url(url: str, workers: int = 0) -> str:
    """``url`` with ``join=1`` added to its query (kept if already there), and ``workers=W`` when given."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.setdefault("join", "1")
    if workers > 0:
        query["workers"] = str(workers)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), parts.fragment))


@dataclass
class PeerView:
    """What the command last saw of one page, so that only changes are printed.

    Units can take less than a polling interval, so a peer's progress is told by its count of uploaded
    units, not by catching every ``training`` state; waiting, refusals, going offline and finishing print
    when they start.
    """

    number: int
    page: Any  # playwright.sync_api.Page
    state: str = ""
    kind: str = ""
    units_done: int = 0
    peer_id: str | None = None
    workers: tuple[str, ...] = ()  # the peer ids of the page's training workers that joined
    gone: str | None = None  # why the page no longer counts (failed to boot, crashed, closed)
    local: dict[str, Any] | None = None  # a local task: the summary of the files the page was given

    @property
    def name(self) -> str:
        return f"peer {self.number}" + (f" ({self.peer_id})" if self.peer_id else "")

    def look(self) -> list[str]:
        """Read the page's state; returns the lines worth printing."""
        if self.gone:
            return []
        try:
            seen = self.page.evaluate(PAGE_PROBE)
        except Exception as error:  # the page crashed or was closed under us
            self.gone = f"page lost: {str(error).splitlines()[0]}"
            return [f"{self.name}: {self.gone}"]
        lines = []
        state, kind, activity = seen.get("state") or "", seen.get("kind") or "", seen.get("activity")
        if state != self.state:
            self.state = state
            if state == "ready":
                lines.append(f"{self.name}: Pyodide booted")
            elif state == "failed":
                self.gone = f"failed to boot: {seen.get('error') or 'no message'}"
                lines.append(f"{self.name}: {self.gone}")
        local = seen.get("local")
        if local and local != self.local:
            self.local = local
            lines.append(f"{self.name}: {describe_local(local)}")
        if seen.get("peerId") and not self.peer_id:
            self.peer_id = seen["peerId"]
            lines.append(f"peer {self.number}: joined as {self.peer_id}")
        workers = tuple(seen.get("workers") or ())
        if len(workers) > 1 and workers != self.workers:
            lines.append(f"{self.name}: {len(workers)} training workers joined ({', '.join(workers)})")
        self.workers = workers
        units_done = int(seen.get("unitsDone") or 0)
        if units_done != self.units_done:
            self.units_done = units_done
            lines.append(f"{self.name}: {units_done} unit{'s' if units_done > 1 else ''} uploaded")
        if kind != self.kind and kind in QUIET_KINDS_START:
            lines.append(f"{self.name}: {activity}")
        self.kind = kind
        return lines


def describe_local(summary: dict[str, Any]) -> str:
    """A page's summary of its files in one line (examples, the split, refused files with the reason)."""
    refused = [f["error"] for f in summary.get("files", []) if f.get("error")]
    return (f"{summary.get('examples', 0)} examples from {summary.get('valid_files', 0)} file(s) "
            f"({summary.get('train', 0)} train, {summary.get('held_out', 0)} held out)"
            + (f"; refused: {'; '.join(refused)}" if refused else "") + ("" if summary.get("ready") else
                                                                           "; not enough to train"))


def give_files(page: Any, folder: Path) -> int:
    """Choose ``folder``'s files in the page's file chooser (its folder input when it has sub-folders, as a person
    choosing the folder would); returns how many files it holds."""
    files = [p for p in sorted(Path(folder).rglob("*")) if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(folder).parts)]
    if any(p.parent != Path(folder) for p in files):
        page.set_input_files("#local-folder", str(folder))
    else:
        page.set_input_files("#local-files", [str(p) for p in files])
    return len(files)


@contextmanager
def stop_flag() -> Iterator[list[int]]:
    """Turn SIGINT and SIGTERM into a flag the polling loop checks (never an exception inside Playwright)."""
    caught: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def session_status(relay: RelayClient) -> dict[str, Any] | None:
    """The relay's ``/api/session``; None while it cannot be reached (a restart, say)."""
    try:
        return relay.status()
    except httpx.HTTPError:
        return None
    except RelayRefusal as refusal:
        if refusal.status == 404:
            raise LookupError("the relay runs no session (started with --no-session?)") from refusal
        return None


def describe_round(status: dict[str, Any]) -> str:
    peers = status.get("peers", {})
    progress = status.get("round_progress", {})
    history = status.get("history") or []
    metric = status.get("metric", "")
    value = (history[-1].get("metrics") or {}).get(metric) if history else None
    shown = f"{metric} {value:.4g} · " if isinstance(value, int | float) else ""
    return f"{shown}{progress.get('done', 0)}/{progress.get('slots', 0)} units · {peers.get('connected', 0)} peers"


def run_peers(count: int, url: str, *, timeout_s: float = 0.0, headless: bool = True, poll_s: float = 0.5,
              local_data: Sequence[Path] = (), workers: int = 0) -> int:
    """Start ``count`` pages at ``url?join=1`` and follow the session until it is done; returns the exit status.
    ``local_data``: a local task's files, a folder per peer (``server.session.local_files.peer_folders``);
    ``workers``: training workers per page (0: the page's default)."""
    from playwright.sync_api import sync_playwright

    from runtime.tasks import TaskError
    from server.session.local_files import peer_folders

    if count < 1 or workers < 0:
        print("peertrain peers: N must be at least 1 and --workers 0 or more", file=sys.stderr)
        return 2
    try:
        folders = peer_folders(local_data) if local_data else []
    except TaskError as error:
        print(f"peertrain peers: {error}", file=sys.stderr)
        return 2
    if folders and len(folders) < count:
        print(f"peertrain peers: {count} peers need {count} folders of local data; --local-data gives "
              f"{len(folders)}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    target = join_url(url, workers)
    with stop_flag() as caught, httpx.Client(base_url=url, timeout=5) as http, sync_playwright() as playwright:
        relay = RelayClient(http)
        try:
            if session_status(relay) is None:
                print(f"peertrain peers: no relay answers at {url} yet; waiting for it", file=sys.stderr)
        except LookupError as error:
            print(f"peertrain peers: {error}", file=sys.stderr)
            return 2
        browser = playwright.chromium.launch(**launch_options(headless=headless), handle_sigint=False,
                                             handle_sigterm=False)
        bar = tqdm(total=1, unit="round", desc="session", dynamic_ncols=True, file=sys.stderr)
        try:
            views = []
            for number in range(1, count + 1):
                page = browser.new_context().new_page()
                page.goto(target)
                if folders:
                    given = give_files(page, folders[number - 1])
                    tqdm.write(f"peer {number}: chose {given} file(s) of {folders[number - 1]} in its page (they stay "
                               "in the browser)")
                views.append(PeerView(number, page))
            tqdm.write(f"{count} headless peer{'s' if count > 1 else ''} opened {target}")
            while True:
                if caught:
                    tqdm.write(f"peertrain peers: {signal.Signals(caught[0]).name}; closing the browser")
                    return 130
                status = session_status(relay)
                if status is not None:
                    bar.total = max(1, int(status.get("num_rounds") or 1))
                    bar.n = min(int(status.get("round") or 0), bar.total)
                    bar.set_postfix_str(describe_round(status), refresh=False)
                    bar.refresh()
                for view in views:  # (before `done`: what a page did in the session's last poll is told too)
                    for line in view.look():
                        tqdm.write(line)
                if status is not None and status.get("done"):
                    tqdm.write(f"session done: {status.get('stopped') or 'all rounds complete'}")
                    return 0
                if all(view.gone for view in views):
                    tqdm.write("peertrain peers: no page is left to train")
                    return 1
                if deadline is not None and time.monotonic() > deadline:
                    tqdm.write(f"peertrain peers: the session was not done after {timeout_s:g} s")
                    return 1
                time.sleep(poll_s)
        except LookupError as error:
            tqdm.write(f"peertrain peers: {error}")
            return 2
        finally:
            bar.close()
            browser.close()
