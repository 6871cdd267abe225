"""House rules that keep the code base in shape (STYLE.md): module size and dependency direction."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 500
PACKAGES = ("runtime", "server")
# Only the WebGPU backend may touch the browser, and only lazily (inside functions).
BROWSER_MODULES = frozenset({"js", "pyodide"})
WEBGPU_BACKEND_PREFIX = "runtime/backend/webgpu"


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO_ROOT / folder).rglob("*.py"))


def top_level_imports(tree: ast.Module) -> list[tuple[str, int, bool]]:
    """(module root, line, is at module level) for every import in the tree."""
    module_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno, id(node) in module_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno, id(node) in module_level))
    return found


@pytest.mark.parametrize("path", python_files(*PACKAGES, "tests"), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_module_stays_under_line_budget(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO_ROOT)} has {lines} lines (budget {MAX_MODULE_LINES})"


def runtime_import_violations(path: Path) -> list[str]:
    relative = path.relative_to(REPO_ROOT).as_posix()
    allowed = set(sys.stdlib_module_names) | {"numpy", "runtime", "__future__"}
    problems = []
    for module, line, module_level in top_level_imports(ast.parse(path.read_text())):
        if module in BROWSER_MODULES and relative.startswith(WEBGPU_BACKEND_PREFIX) and not module_level:
            continue
        if module not in allowed:
            problems.append(f"{relative}:{line} imports {module}")
    return problems


def test_runtime_imports_only_numpy_and_stdlib() -> None:
    problems = [p for path in python_files("runtime") for p in runtime_import_violations(path)]
    assert problems == []


def test_the_import_check_catches_violations(tmp_path: Path) -> None:
    """The rule above must be able to fail: feed it a module that breaks it."""
    bad = REPO_ROOT / "runtime" / "_shape_probe_tmp.py"
    bad.write_text("import os\nimport starlette\nfrom server import app\n\ndef f():\n    import js\n")
    try:
        problems = runtime_import_violations(bad)
    finally:
        bad.unlink()
    assert [p.split(" imports ")[1] for p in problems] == ["starlette", "server", "js"]
