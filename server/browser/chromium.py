"""Where Debian's Chromium is and how to launch it (Playwright's own browser download fails offline, so the
system package is used)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

LAUNCH_ARGS = (
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--enable-unsafe-webgpu",
)


class ChromiumNotFound(RuntimeError):
    """No Chromium binary: say how to get one."""


def chromium_path() -> str:
    """``PEERTRAIN_CHROMIUM`` if set, else Debian's ``/usr/bin/chromium``, else ``chromium`` on PATH."""
    configured = os.environ.get("PEERTRAIN_CHROMIUM")
    if configured:
        if not Path(configured).is_file():
            raise ChromiumNotFound(f"PEERTRAIN_CHROMIUM={configured} does not name a file")
        return configured
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise ChromiumNotFound(
        "Chromium not found: install Debian's package (`apt-get install chromium`, as root) "
        "or set PEERTRAIN_CHROMIUM to a Chromium binary"
    )


def launch_options(*, headless: bool = True) -> dict:
    """Keyword arguments for Playwright's ``chromium.launch``."""
    return {"executable_path": chromium_path(), "headless": headless, "args": list(LAUNCH_ARGS)}
