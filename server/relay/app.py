"""The relay's Starlette application: the page, its assets, the documentation site under ``/docs`` and, with a
relay, the session API under ``/api``.

Every request passes ``SecurityHeaders`` and ``BodyLimits`` (``server.relay.limits``: a body must arrive within
a deadline and under a size limit, so a trickled upload cannot hold a request task for long).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from server.paths import REPO_ROOT
from server.relay import admin_endpoints, endpoints, peer_endpoints, static, storage
from server.relay.docs_site import DocsSite
from server.relay.limits import NO_BODY_LIMIT, BodyLimits, plain_refusal_response
from server.relay.options import ServerLimits
from server.relay.state import Relay

# Only our own origin; Pyodide compiles WebAssembly, which needs 'wasm-unsafe-eval' (not 'unsafe-eval').
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
    # Cross-origin isolation (the page, the worker, Pyodide, wheels and the chart library all come from this origin):
    # SharedArrayBuffer, and with it WebAssembly threads, needs it; the page reports ``crossOriginIsolated``.
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-embedder-policy", b"require-corp"),
)
PYODIDE_SUFFIXES = frozenset({".js", ".mjs", ".wasm", ".zip", ".json", ".whl", ".map"})
PAGE_SUFFIXES = frozenset({".js", ".css", ".svg", ".png", ".html"})
# Front-end libraries from npm, served under fixed names: /vendor/<name> -> web/node_modules/<path>.
CLOSE_MERGE_SECONDS = 30.0  # the shutdown waits this long for a merge in flight to write its checkpoint
GZIP_MIN_BYTES = 1024  # smaller answers fit one packet either way
GZIP_LEVEL = 6  # zlib's default: within a few percent of 9's size at a fraction of its CPU
GZIP_EXCLUDED = ("application/octet-stream", "text/event-stream", "application/wasm")
VENDOR_FILES = {"chart.umd.js": "chart.js/dist/chart.umd.js"}


@dataclass(frozen=True, kw_only=True)
class RelayPaths:
    """Where the relay finds what it serves. Defaults: this checkout."""

    web: Path = field(default_factory=lambda: REPO_ROOT / "web")
    wheels: Path = field(default_factory=lambda: REPO_ROOT / "wheels")
    docs: Path = field(default_factory=lambda: REPO_ROOT / "site")  # the documentation site (mkdocs build)

    @property
    def node_modules(self) -> Path:
        return self.web / "node_modules"

    @property
    def pyodide_core(self) -> Path:
        return self.node_modules / "pyodide"

    def missing(self) -> list[str]:
        """What set-up has not produced yet, as messages a person can act on."""
        problems = []
        if not (self.pyodide_core / "pyodide.asm.wasm").is_file():
            problems.append(f"{self.pyodide_core} has no Pyodide core: run `npm ci` in web/ (or `make setup`)")
        if not (self.wheels / "pyodide-lock.json").is_file():
            problems.append(f"{self.wheels}/pyodide-lock.json is missing: run `make setup` to build the wheels")
        return problems


class SecurityHeaders:
    """Adds the Content-Security-Policy and friends to every response (a response that brings its own policy, as
    the documentation site's, keeps it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                message["headers"] = headers + [header for header in SECURITY_HEADERS if header[0] not in present]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _runtime_version(wheels: Path) -> str | None:
    lock_path = wheels / "pyodide-lock.json"
    if not lock_path.is_file():
        return None
    entry = json.loads(lock_path.read_text())["packages"].get("peertrain-runtime")
    return entry["version"] if entry else None


def body_limit(relay: Relay | None) -> int:
    """The largest request body an endpoint accepts: a result of the task's model, or a session request."""
    if relay is None:
        return NO_BODY_LIMIT
    return max(relay.result_body_limit, admin_endpoints.SESSION_BODY_LIMIT, admin_endpoints.UNBAN_BODY_LIMIT,
               peer_endpoints.JOIN_BODY_LIMIT)


def create_app(paths: RelayPaths | None = None, relay: Relay | None = None,
               limits: ServerLimits | None = None) -> Starlette:
    """The page and its assets; with a ``relay``, also the session API (see ``server.relay.state``). ``limits``:
    the body deadline and size limit (``serve``'s options; default ``ServerLimits()``)."""
    paths = paths or RelayPaths()
    limits = limits or ServerLimits()
    max_body = limits.max_body_bytes
    page_tree = static.FileTree([paths.web / "src"], allowed_suffixes=PAGE_SUFFIXES)
    wheels_tree = static.FileTree([paths.wheels], allowed_suffixes=PYODIDE_SUFFIXES)
    core_tree = static.FileTree([paths.pyodide_core], cache_control=static.IMMUTABLE,
                                allowed_suffixes=PYODIDE_SUFFIXES - {".json"})

    async def index(request: Request) -> Response:
        return static.file_response(paths.web / "index.html", cache_control=static.REVALIDATE, request=request)

    async def pyodide_files(request: Request) -> Response:
        """The lock file and wheels we built come first; the npm package's core files after them."""
        relative = request.path_params["path"]
        for tree in (wheels_tree, core_tree):
            found = tree.find(relative)
            if found is not None:
                return static.file_response(found, cache_control=tree.cache_control, request=request)
        return static.not_found()

    async def vendor(request: Request) -> Response:
        relative = VENDOR_FILES.get(request.path_params["path"])
        found = static.safe_join(paths.node_modules, relative) if relative else None
        if found is None:
            return static.not_found()
        return static.file_response(found, cache_control=static.REVALIDATE, request=request)

    async def healthz(request: Request) -> Response:
        problems = paths.missing()
        body = {"ok": not problems, "problems": problems, "runtime_version": _runtime_version(paths.wheels)}
        return JSONResponse(body, status_code=200 if not problems else 503)

    routes: list[BaseRoute] = [
        Route("/", index),
        Route("/healthz", healthz),
        Route("/src/{path:path}", page_tree.endpoint),
        Route("/pyodide/{path:path}", pyodide_files),
        Route("/wheels/{path:path}", wheels_tree.endpoint),
        Route("/vendor/{path:path}", vendor),
        Route("/docs", lambda request: RedirectResponse("/docs/", status_code=308)),
        Mount("/docs", app=DocsSite(paths.docs)),
    ]
    if relay is not None:
        routes.append(endpoints.API)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        watch = None
        if relay is not None:
            relay.open()
            relay.verification.on_loop()  # (replays a restart queued before the loop ran: their verdicts apply)
            if relay.sharing.watching:  # (other relays may serve the session too: server.relay.sharing)
                watch = asyncio.get_running_loop().create_task(relay.sharing.watch())
        try:
            yield
        finally:
            if watch is not None:
                watch.cancel()
            if relay is not None:
                if not await relay.merges.hold_for_close(CLOSE_MERGE_SECONDS):
                    print(f"a merge still ran {CLOSE_MERGE_SECONDS:g} s into the shutdown: closing without it (the "
                          "next start merges again from the last checkpoint)", flush=True)
                relay.close()

    body_limits = Middleware(BodyLimits, timeout=limits.body_timeout,
                             max_bytes=(lambda: max_body) if max_body is not None else (lambda: body_limit(relay)),
                             respond=endpoints.refusal_response if relay is not None else plain_refusal_response,
                             on_cut_off=(lambda: relay.store.count("bodies_cut_off")) if relay is not None else None)
    # JSON, the page's scripts and styles go gzip-compressed to a client that takes it; binary messages do not (float32
    # and int8 payloads barely shrink, and an immutable message's ETag names its bytes), nor the event stream (a
    # compressor would hold its events back), nor Pyodide's WebAssembly (9 MB per page load: the CPU is better spent).
    gzip = Middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=GZIP_LEVEL,
                      exclude_content_types=(*DEFAULT_EXCLUDED_CONTENT_TYPES, *GZIP_EXCLUDED))
    # Behind a reverse proxy: the client's address is the right-most X-Forwarded-For address that none of the
    # trusted proxies added (uvicorn's maintained implementation); a header from anyone else is left alone.
    trusted = relay.options.forwarded_allow_ips if relay is not None else None
    proxies = [Middleware(ProxyHeadersMiddleware, trusted_hosts=trusted)] if trusted else []
    app = Starlette(routes=routes, middleware=[*proxies, gzip, Middleware(SecurityHeaders), body_limits],
                    lifespan=lifespan,
                    exception_handlers=dict(endpoints.EXCEPTION_HANDLERS) | storage.EXCEPTION_HANDLERS)
    app.state.relay = relay
    return app
