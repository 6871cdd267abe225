"""Pyodide packages are kept only when their sha256 matches the official lock."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from server.browser_assets import assets


def make_official_lock(core: Path, files: dict[str, bytes]) -> None:
    core.mkdir(parents=True)
    packages = {
        name: {"name": name, "file_name": f"{name}-1.0-py3-none-any.whl", "depends": [],
               "sha256": hashlib.sha256(content).hexdigest(), "version": "1.0"}
        for name, content in files.items()
    }
    packages["numpy"]["depends"] = []
    lock = {"info": {"version": assets.PYODIDE_VERSION}, "packages": packages}
    (core / "pyodide-lock.json").write_text(json.dumps(lock))


def make_fallback(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            archive.writestr(f"{assets.FALLBACK_MEMBER_PREFIX}{name}-1.0-py3-none-any.whl", content)
        archive.writestr(f"{assets.FALLBACK_MEMBER_PREFIX}other-1.0-py3-none-any.whl", b"not wanted")
    return path


GENUINE = {"numpy": b"numpy build", "micropip": b"micropip build", "packaging": b"packaging build"}


def test_verified_files_are_kept_and_reused(tmp_path: Path) -> None:
    core, cache = tmp_path / "core", tmp_path / "cache"
    make_official_lock(core, GENUINE)
    fallback = make_fallback(tmp_path / "fallback.whl", GENUINE)
    logs: list[str] = []
    entries = assets.fetch_packages(core, cache, use_cdn=False, fallback_wheel=fallback,
                                    log=logs.append)
    assert sorted(e["name"] for e in entries) == ["micropip", "numpy", "packaging"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(e["file_name"] for e in entries)  # nothing else kept
    # Second run: everything cached and verified, the fallback is not even opened.
    fallback.unlink()
    logs.clear()
    assets.fetch_packages(core, cache, use_cdn=False, log=logs.append)
    assert logs == [f"Pyodide packages: 3 cached and verified in {cache}"]


def test_tampered_file_is_refused_and_not_kept(tmp_path: Path) -> None:
    core, cache = tmp_path / "core", tmp_path / "cache"
    make_official_lock(core, GENUINE)
    tampered = dict(GENUINE, numpy=b"numpy build with a backdoor")
    fallback = make_fallback(tmp_path / "fallback.whl", tampered)
    with pytest.raises(assets.AssetVerificationError, match="numpy-1.0-py3-none-any.whl: sha256 .* does not match"):
        assets.fetch_packages(core, cache, use_cdn=False, fallback_wheel=fallback, log=lambda _: None)
    assert not (cache / "numpy-1.0-py3-none-any.whl").exists()
    assert not list(cache.glob("*.part"))


def test_tampered_cached_file_is_replaced(tmp_path: Path) -> None:
    core, cache = tmp_path / "core", tmp_path / "cache"
    make_official_lock(core, GENUINE)
    fallback = make_fallback(tmp_path / "fallback.whl", GENUINE)
    assets.fetch_packages(core, cache, use_cdn=False, fallback_wheel=fallback, log=lambda _: None)
    (cache / "numpy-1.0-py3-none-any.whl").write_bytes(b"swapped on disk")
    assets.fetch_packages(core, cache, use_cdn=False, fallback_wheel=fallback, log=lambda _: None)
    assert (cache / "numpy-1.0-py3-none-any.whl").read_bytes() == GENUINE["numpy"]


def test_wrong_pyodide_version_is_refused(tmp_path: Path) -> None:
    core = tmp_path / "core"
    core.mkdir()
    (core / "pyodide-lock.json").write_text(json.dumps({"info": {"version": "0.26.0"}, "packages": {}}))
    with pytest.raises(assets.AssetVerificationError, match="expected 0.27.7"):
        assets.load_official_lock(core)


def test_real_lock_pins_the_numpy_build_from_design() -> None:
    core = Path(__file__).resolve().parents[3] / "web" / "node_modules" / "pyodide"
    if not (core / "pyodide-lock.json").is_file():
        pytest.skip("web/node_modules/pyodide is not installed (run `make setup`)")
    numpy = assets.load_official_lock(core)["packages"]["numpy"]
    assert numpy["file_name"] == "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl"
    assert numpy["sha256"] == "ebb61241d962b98b21597d7ce43b67668a6d5bab3acec4fbe958657320d7cd08"
