"""Poisoning a page's uploads in flight: a ``page.route`` handler that replaces a page's ``POST /api/result`` body
with a poisoned update (the real result decoded with ``runtime.wire``, rewritten from the global weights the
page itself could fetch with its own token, re-encoded with the same header, as float32 weights or as an update in
the session's codec); shared by the attacker tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import httpx
import numpy as np
from browser_helpers import BOOT_SECONDS, admin, wait_for_status
from playwright.sync_api import Browser, Page, Route

from runtime import wire
from runtime.codec import Codec
from server.bench.attack_peers import as_upload, flip, result_weights
from server.browser.peers import join_url
from server.relay.client import RelayClient, weights_call


class Poisoner:
    """A ``page.route`` handler for ``POST /api/result``: the page's real result, flipped, with its header."""

    def __init__(self, url: str, poison: Callable[[np.ndarray, np.ndarray], np.ndarray] = flip,
                 codec: Codec | None = None) -> None:
        self.url = url
        self.poison = poison  # (global weights, the page's real result) -> what is uploaded instead
        self.codec = codec  # the session's result codec, where results travel as updates
        self.poisoned: list[tuple[int, int]] = []  # (round, slot) of each flipped upload
        self.passed: list[str] = []  # uploads sent on unchanged, and why
        self.answers: list[int] = []

    def __call__(self, route: Route) -> None:
        request = route.request
        try:
            body = request.post_data_buffer or b""
            with httpx.Client(base_url=self.url, timeout=30) as http:
                response = RelayClient(http).send(
                    weights_call(), headers={"Authorization": request.all_headers().get("authorization", "")})
            global_header, global_weights = wire.decode(response.content)
            header, result = result_weights(body, global_weights, self.codec)
        except Exception as error:  # noqa: BLE001 (the page must not hang on a failed interception)
            self.passed.append(f"{type(error).__name__}: {error}")
            route.continue_()
            return
        if global_header.round != header.round:
            self.passed.append(f"round {header.round} result, weights of round {global_header.round}")
            route.continue_()
            return
        self.poisoned.append((header.round, int(header.meta.get("slot", -1))))
        route.continue_(post_data=as_upload(self.poison(global_weights, result), header, global_weights, self.codec))


def open_pages(browser: Browser, url: str, count: int, poisoner: Poisoner, pages: list[Page],
               relay: subprocess.Popen) -> None:
    """``count`` pages in their own contexts, added to ``pages`` (the caller's list: the caller closes them, also when
    this fails); the first one's result uploads go through ``poisoner``. The session is paused until all have joined,
    so each takes a slot of the first round."""
    admin(url, "pause")
    for index in range(count):
        page = browser.new_context().new_page()
        pages.append(page)
        if index == 0:
            page.route("**/api/result?*", poisoner)
        page.goto(join_url(url))
    wait_for_status(url, lambda s: s["peers"]["joined"] >= count, timeout_s=BOOT_SECONDS + 60,
                    what=f"{count} pages to join", pages=pages, relay=relay)
    admin(url, "resume")
