"""Serving files safely: the page, the Pyodide core, the wheels.

No directory listing, no path traversal, no hidden files; correct content types
(``application/wasm`` for the interpreter) and cache headers that fit each kind of file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.staticfiles import NotModifiedResponse, StaticFiles

CONTENT_TYPES = {
    ".wasm": "application/wasm",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".whl": "application/zip",
    ".zip": "application/zip",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".map": "application/json",
}

# Versioned third-party files never change under the same name; our own files may change on every build.
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"


def safe_join(root: Path, relative: str) -> Path | None:
    """``root / relative`` when it names a regular file inside ``root``; None otherwise."""
    if not relative or "\\" in relative or "\x00" in relative:
        return None
    parts = relative.split("/")
    if any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        return None
    root = root.resolve()
    candidate = root.joinpath(*parts).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        return None
    return candidate


# Starlette's own conditional-request rules (If-None-Match, If-Modified-Since), as its StaticFiles applies them.
_CONDITIONS = StaticFiles(directory=".", check_dir=False)


def file_response(path: Path, *, cache_control: str, request: Request | None = None) -> Response:
    """The file with its content type, cache headers and validators (FileResponse's ETag and Last-Modified); ``304``
    to a ``request`` that already holds it. A "no-cache" file is revalidated on each use, so a second worker of a
    page (or a reload) gets its wheels from the browser's cache for a header's worth of bytes."""
    media_type = CONTENT_TYPES.get(path.suffix.lower(), "application/octet-stream")
    response = FileResponse(path, media_type=media_type, headers={"Cache-Control": cache_control},
                            stat_result=path.stat())
    if request is not None and _CONDITIONS.is_not_modified(Headers(raw=response.raw_headers), request.headers):
        return NotModifiedResponse(Headers(raw=response.raw_headers))
    return response


def not_found() -> Response:
    return PlainTextResponse("not found\n", status_code=404)


class FileTree:
    """Serve files from the first of several folders that holds the requested name."""

    def __init__(self, roots: Sequence[Path], *, cache_control: str = REVALIDATE,
                 allowed_suffixes: frozenset[str] | None = None) -> None:
        self.roots = tuple(roots)
        self.cache_control = cache_control
        self.allowed_suffixes = allowed_suffixes

    def find(self, relative: str) -> Path | None:
        for root in self.roots:
            path = safe_join(root, relative)
            if path is not None and (self.allowed_suffixes is None or path.suffix.lower() in self.allowed_suffixes):
                return path
        return None

    async def endpoint(self, request: Request) -> Response:
        path = self.find(request.path_params.get("path", ""))
        if path is None:
            return not_found()
        return file_response(path, cache_control=self.cache_control, request=request)
