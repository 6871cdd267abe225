"""The documentation site at ``/docs``: the pages ``make setup`` builds from ``docs/`` with MkDocs into ``site/``.

Files are served by Starlette's ``StaticFiles`` (``html=True``: ``/docs/tasks/writing/`` is its ``index.html``, a
missing page is the site's ``404.html``), from this machine like every other asset. The theme's pages carry a few
small inline scripts (its settings and the colour scheme, set before the page paints); the relay's policy allows no
inline script, so the site's answers name exactly those scripts by their sha256 in their own
Content-Security-Policy (read from the built pages once per build) instead of allowing any inline script.
A relay whose checkout has no built site answers ``/docs`` with 404 and what to run.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from starlette.responses import PlainTextResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>(.*?)</script>", re.S)
NOT_BUILT = "The documentation site is not built in this checkout: run `make setup` (it runs mkdocs build).\n"


def inline_script_hashes(site: Path) -> list[str]:
    """The CSP source of every inline script in the built pages (``'sha256-...'``), sorted."""
    found = set()
    for page in site.rglob("*.html"):
        for script in INLINE_SCRIPT.findall(page.read_bytes()):
            found.add("'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode() + "'")
    return sorted(found)


def content_security_policy(hashes: list[str]) -> str:
    return ("default-src 'self'; script-src 'self' " + " ".join(hashes) + "; worker-src 'self'; connect-src 'self'; "
            "img-src 'self' data:; style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
            "form-action 'self'")


class DocsSite:
    """An ASGI app for the built site under a mount (``Mount("/docs", DocsSite(site))``)."""

    def __init__(self, site: Path) -> None:
        self.site = site
        self.files = StaticFiles(directory=site, html=True, check_dir=False)
        self._policy: tuple[float, bytes] | None = None  # (the build's time, its policy)

    def built(self) -> bool:
        return (self.site / "index.html").is_file()

    def policy(self) -> bytes:
        stamp = (self.site / "index.html").stat().st_mtime
        if self._policy is None or self._policy[0] != stamp:
            self._policy = (stamp, content_security_policy(inline_script_hashes(self.site)).encode())
        return self._policy[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.built():
            await PlainTextResponse(NOT_BUILT, status_code=404)(scope, receive, send)
            return
        policy = self.policy()

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"content-security-policy", policy)]
            await send(message)

        await self.files(scope, receive, send_with_policy)
