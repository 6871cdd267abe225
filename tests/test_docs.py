"""The README is a front door and the documentation site builds: every link resolves, no page is left out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from server.relay import openapi
from server.relay.endpoints import API

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    targets = [target for target in LINK.findall(text) if not target.startswith(("http://", "https://", "#"))]
    assert "docs/page.png" in targets and "docs/getting-started.md" in targets
    missing = [target for target in targets if not (REPO_ROOT / target.split("#", 1)[0]).exists()]
    assert missing == []


def test_the_site_builds_in_strict_mode_with_every_endpoint(tmp_path: Path) -> None:
    """mkdocs build --strict: a broken link, a missing anchor or a page off the nav fails it."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    site = tmp_path / "site"
    run = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(site)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    api_page = (site / "api" / "index.html").read_text()
    for path, item in openapi.document(API)["paths"].items():
        for method in item:
            if method != "head":
                assert f"{method.upper()} {path}" in api_page, (method, path)
    home = (site / "index.html").read_text()
    assert 'href="getting-started/"' in home and 'href="benchmarks/"' in home  # the README's links, on the site
    assert not re.search(r"<(?:script|link)[^>]+(?:src|href)=\"https?://", home)  # nothing from a CDN


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The same configuration over a copy of the pages with one link to nowhere: the build stops."""
    import shutil

    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    for name in ("README.md", "BENCHMARKS.md"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    config = (REPO_ROOT / "mkdocs.yml").read_text().replace("scripts/mkdocs_hooks.py",
                                                            str(REPO_ROOT / "scripts" / "mkdocs_hooks.py"))
    (tmp_path / "mkdocs.yml").write_text(config)
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](sessions/missing.md).\n")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    run = subprocess.run([str(mkdocs), "build", "--site-dir", str(tmp_path / "site")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode != 0 and "sessions/missing.md" in run.stdout + run.stderr
