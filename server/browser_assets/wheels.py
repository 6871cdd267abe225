"""Build ``wheels/``: every wheel a browser installs, and the ``pyodide-lock.json`` that lists them.

Order that works offline (``pyodide build`` would download a cross-build environment, so it is not
used): copy the verified Pyodide packages in, write a lock that
holds only their official entries, build our pure-Python wheels with ``pip wheel``, add them with
``pyodide lockfile add-wheels`` (it wants the ``py3-none-any`` tag), then ``pyodide py-compile``
the folder, which compiles our wheels to ``.pyc`` for Pyodide's CPython 3.12 and rewrites the
folder's lock with the new file names and hashes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from server.browser_assets import assets
from server.paths import REPO_ROOT

RUNTIME_DIST = "peertrain-runtime"
LOCK_NAME = "pyodide-lock.json"


def _bin(name: str) -> str:
    """A console script of the running interpreter's environment (the project's .venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def build_pure_wheel(dist_name: str, package_dirs: Sequence[Path], out_dir: Path, *, version: str = "0.1.0",
                     dependencies: Sequence[str] = ("numpy",)) -> Path:
    """``pip wheel`` a py3-none-any wheel named ``dist_name`` holding the given package folders."""
    with tempfile.TemporaryDirectory(prefix="peertrain-wheel-") as tmp:
        staging = Path(tmp)
        for package_dir in package_dirs:
            shutil.copytree(package_dir, staging / package_dir.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        deps = ", ".join(json.dumps(d) for d in dependencies)
        (staging / "pyproject.toml").write_text(
            "[build-system]\nrequires = [\"setuptools>=69\"]\nbuild-backend = \"setuptools.build_meta\"\n\n"
            f"[project]\nname = \"{dist_name}\"\nversion = \"{version}\"\ndependencies = [{deps}]\n\n"
            "[tool.setuptools.packages.find]\nwhere = [\".\"]\n\n"
            "[tool.setuptools.package-data]\n\"*\" = [\"*.wgsl\", \"*.json\"]\n"
        )
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                   "-w", str(out_dir), str(staging)]
        subprocess.run(command, check=True)
    normalized = dist_name.replace("-", "_")
    built = sorted(out_dir.glob(f"{normalized}-{version}-py3-none-any.whl"))
    if not built:
        raise RuntimeError(f"pip wheel produced no {normalized}-{version}-py3-none-any.whl in {out_dir}")
    return built[0]


def build_wheels(repo_root: Path, *, extra_packages: Sequence[tuple[str, Sequence[Path]]] = (),
                 out_dir: Path | None = None, log: assets.Log = print) -> Path:
    """Rebuild ``out_dir`` (default ``wheels/``) from scratch; returns the path of its lock file.

    ``extra_packages`` are (distribution name, package folders) pairs, e.g. a custom task module.
    """
    core_dir = repo_root / "web" / "node_modules" / "pyodide"
    cache_dir = repo_root / ".cache" / "pyodide-packages"
    out_dir = out_dir or repo_root / "wheels"
    entries = assets.fetch_packages(core_dir, cache_dir, log=log)

    staging_dir = out_dir.with_name(out_dir.name + ".new")
    shutil.rmtree(staging_dir, ignore_errors=True)
    staging_dir.mkdir(parents=True)
    for entry in entries:
        shutil.copy2(cache_dir / entry["file_name"], staging_dir / entry["file_name"])
    official = assets.load_official_lock(core_dir)
    base_lock = dict(official, packages={entry["name"]: entry for entry in entries})
    base_lock_path = staging_dir / "base-lock.json"
    base_lock_path.write_text(json.dumps(base_lock, indent=1))

    ours = [build_pure_wheel(RUNTIME_DIST, [repo_root / "runtime"], staging_dir)]
    for dist_name, package_dirs in extra_packages:
        ours.append(build_pure_wheel(dist_name, package_dirs, staging_dir))
    log(f"built {', '.join(p.name for p in ours)}")

    pyodide = _bin("pyodide")
    subprocess.run([pyodide, "lockfile", "add-wheels", "--input", str(base_lock_path),
                    "--output", str(staging_dir / LOCK_NAME), "--base-path", str(staging_dir),
                    *map(str, ours)], check=True, stdout=subprocess.DEVNULL)
    base_lock_path.unlink()
    # py-compile only the wheels we built: the official files stay byte-identical to the verified ones.
    excluded = ",".join(entry["file_name"] for entry in entries)
    subprocess.run([pyodide, "py-compile", "--silent", "--no-keep", "--exclude", excluded, str(staging_dir)],
                   check=True)
    _restore_info(staging_dir / LOCK_NAME, official["info"])
    _check_lock(staging_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging_dir.replace(out_dir)
    log(f"wheels/: {len(list(out_dir.glob('*.whl')))} wheels, lock {out_dir / LOCK_NAME}")
    return out_dir / LOCK_NAME


def _restore_info(lock_path: Path, info: dict) -> None:
    """pyodide-lock drops ``info.version``, which Pyodide checks against its own: put the official block back."""
    lock = json.loads(lock_path.read_text())
    lock["info"] = info
    lock_path.write_text(json.dumps(lock, indent=1, sort_keys=True))


def _check_lock(folder: Path) -> None:
    """Every lock entry names a file in ``folder`` with the hash the lock claims."""
    lock = json.loads((folder / LOCK_NAME).read_text())
    for name, entry in lock["packages"].items():
        path = folder / entry["file_name"]
        if not path.is_file():
            raise RuntimeError(f"lock entry {name!r} names {entry['file_name']}, which is not in {folder}")
        assets.verify(path, entry["sha256"])


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m server.browser_assets.wheels", description=__doc__)
    parser.add_argument("--root", type=Path, default=REPO_ROOT)
    args = parser.parse_args(argv)
    try:
        build_wheels(args.root)
    except (assets.AssetVerificationError, assets.AssetUnavailableError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
