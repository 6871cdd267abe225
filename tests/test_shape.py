"""House rules that keep the code base in shape: module size, dependency direction, no import cycles.

Module size is a report first (``tests/sz.py``: lines per module, per package, the ones over the 300-line target
marked); the tests here fail only past the limits: 400 lines for a part of the relay (``server/relay/``), and 500 for
any module, a backstop. A module near a limit is split by concept, never trimmed to fit.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from import_graph import closed_path, cycles, import_graph
from sz import HARD_LIMIT, RELAY_FOLDER, RELAY_LIMIT, Module, line_count, modules, over_limit, report

REPO_ROOT = Path(__file__).resolve().parents[1]
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
    """The backstop: no module over 500 lines (the report, ``tests/sz.py``, shows them long before)."""
    lines = line_count(path)
    assert lines <= HARD_LIMIT, f"{path.relative_to(REPO_ROOT)} has {lines} lines (limit {HARD_LIMIT}; see tests/sz.py)"


@pytest.mark.parametrize("path", python_files(RELAY_FOLDER), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_relay_part_stays_under_its_limit(path: Path) -> None:
    """Each part of the relay is one concept of a few hundred lines: under 400."""
    lines = line_count(path)
    assert lines <= RELAY_LIMIT, f"{path.relative_to(REPO_ROOT)} has {lines} lines (relay limit {RELAY_LIMIT}); " \
        "split it by concept (tests/sz.py shows the budget)"


def test_the_size_report_marks_what_the_limits_catch(tmp_path: Path) -> None:
    """The report and the limits agree, and can fail: a relay module of 401 lines and another module of 501 are over
    their limits, one of 450 outside the relay is only marked, one of 300 is not."""
    sizes = {"server/relay/big.py": 401, "server/relay/fine.py": 300, "server/other/long.py": 450,
             "runtime/huge.py": 501}
    for name, lines in sizes.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n" * lines)
    found = modules(tmp_path, ("runtime", "server"))
    assert {m.path: m.mark for m in found} == {"runtime/huge.py": "!", "server/other/long.py": "+",
                                               "server/relay/big.py": "!", "server/relay/fine.py": ""}
    assert over_limit(found) == [Module("runtime/huge.py", 501), Module("server/relay/big.py", 401)]
    text = report(found)
    assert text.index("server/relay/") < text.index("runtime/")  # packages by total lines, largest first
    assert "2 over their limit" in text and "server/relay/big.py: 401 > 400" in text
    assert "fine.py" not in report(found, marked_only=True)


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


def test_the_import_check_catches_violations() -> None:
    """The rule above must be able to fail: feed it a module that breaks it."""
    bad = REPO_ROOT / "runtime" / "_shape_probe_tmp.py"
    bad.write_text("import os\nimport starlette\nfrom server import app\n\ndef f():\n    import js\n")
    try:
        problems = runtime_import_violations(bad)
    finally:
        bad.unlink()
    assert [p.split(" imports ")[1] for p in problems] == ["starlette", "server", "js"]


def imports_of_test_modules(folder: Path) -> list[str]:
    """``file:line imports name`` for every import, anywhere under ``folder``, of a test module (``test_*``) or of
    ``conftest``. pytest imports both itself: a test module imported by another is imported twice (once by that
    module under its own name) and what it shares hides among tests; ``import conftest`` gets whichever
    conftest.py was loaded last. Shared code goes in a helper module, shared set-up in a conftest fixture."""
    problems = []
    for path in sorted(folder.rglob("*.py")):
        for module, line, _ in top_level_imports(ast.parse(path.read_text())):
            if module == "conftest" or module.startswith("test_"):
                problems.append(f"{path.relative_to(folder).as_posix()}:{line} imports {module}")
    return problems


def test_no_test_module_imports_another_or_a_conftest() -> None:
    assert imports_of_test_modules(REPO_ROOT / "tests") == []


def test_the_test_import_check_catches_a_test_importing_a_test(tmp_path: Path) -> None:
    """The rule above must be able to fail: modules that import test modules and conftest in every way it counts
    (module level, ``from`` and plain, inside a function, a dotted name) beside helpers it allows."""
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "test_a.py").write_text("import numpy\nfrom relay_fixtures import x\nfrom test_b import y\n")
    (tmp_path / "server" / "test_b.py").write_text("def later():\n    import test_a\n\ny = 1\n")
    (tmp_path / "helpers.py").write_text("from conftest import start_relay\nimport test_c.inner\n")
    (tmp_path / "test_clean.py").write_text("import helpers\nfrom testing_tools import z\n")
    assert imports_of_test_modules(tmp_path) == ["helpers.py:1 imports conftest", "helpers.py:2 imports test_c",
                                             "server/test_a.py:3 imports test_b", "server/test_b.py:2 imports test_a"]


# Where an event loop may start on the calling thread: run_async (which moves to a thread of its own when the caller
# already runs one) and the shaped link (a thread of its own). After a browser test, Playwright's sync API leaves a
# loop marked running in the test session's thread, so an asyncio.run there fails only when a browser test ran first.
LOOP_STARTERS = frozenset({"server/harness/peer/transport.py", "server/harness/link.py"})


def loops_started(folder: Path) -> list[str]:
    """``file:line`` of every ``asyncio.run(...)`` or ``loop.run_until_complete(...)`` call under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and (node.func.attr == "run_until_complete"
                         or (node.func.attr == "run" and isinstance(node.func.value, ast.Name)
                             and node.func.value.id == "asyncio"))):
                found.append(f"{path.relative_to(folder).as_posix()}:{node.lineno}")
    return found


def test_event_loops_start_through_run_async() -> None:
    started = [f"{folder}/{place}" for folder in (*PACKAGES, "tests", "examples")
               for place in loops_started(REPO_ROOT / folder)]
    started = [place for place in started if place.split(":")[0] not in LOOP_STARTERS]
    assert started == [], "start an event loop with server.harness.peer.run_async, not asyncio.run"


def test_the_loop_check_finds_both_forms(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import asyncio\n\ndef f(c, loop):\n    asyncio.run(c)\n"
                                   "    loop.run_until_complete(c)\n    runner.run(c)\n")
    assert loops_started(tmp_path) == ["a.py:4", "a.py:5"]


def test_no_import_cycles_among_the_projects_modules() -> None:
    """Dependencies run one way (cli -> relay / session -> runtime); a cycle is named with its path."""
    graph = import_graph(REPO_ROOT, PACKAGES)
    assert len(graph) > 50  # the graph really covers the packages
    found = [" -> ".join(closed_path(graph, component)) for component in cycles(graph)]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_the_cycle_check_finds_a_synthetic_cycle(tmp_path: Path) -> None:
    """The check above must be able to fail: a package whose modules import each other in every way the
    check counts (module level, relative, inside a function, under TYPE_CHECKING, a package __init__)."""
    package = tmp_path / "knot"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from knot import b\n")
    (package / "b.py").write_text("def later():\n    from .c import value\n    return value\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import knot.a\nvalue = 1\n")
    (package / "inner" / "__init__.py").write_text("from knot.inner.leaf import thing\n")
    (package / "inner" / "leaf.py").write_text("import numpy\nfrom knot.inner import other\nthing = 1\n")
    (package / "inner" / "other.py").write_text("import os\n")
    (package / "clean.py").write_text("from knot import a\nimport knot.inner.other\n")
    graph = import_graph(tmp_path, ["knot"])
    assert graph["knot.clean"] == {"knot.a", "knot.inner.other"}
    assert cycles(graph) == [["knot.a", "knot.b", "knot.c"]]
    assert closed_path(graph, ["knot.a", "knot.b", "knot.c"]) == ["knot.a", "knot.b", "knot.c", "knot.a"]
    (package / "inner" / "leaf.py").write_text("from knot.inner import thing as _\nthing = 1\n")
    assert ["knot.inner", "knot.inner.leaf"] in cycles(import_graph(tmp_path, ["knot"]))


# Layers of server/, lowest first: a package may import only from packages below it (and itself). The command line
# sits on top; the simulation and the benches drive the relay and the session; the relay serves a session; the
# session (round loop, packages, checkpoints) knows nothing of HTTP or of the relay.
# ``server.cli.options`` (argparse helpers the benches' own arguments share) is the one module any layer may use.
# The browser launcher starts its relay through the harness: browser sits above it. The browser's assets (its
# wheels, and the host's copy of the browser's engine that replays units with them) depend on no other layer: the
# session's rules ask it whether replays can run on that engine, and the relay's verifier runs it.
LAYERS = {"browser_assets": -1, "session": 0, "relay": 1, "build": 1, "harness": 2, "simulation": 2, "browser": 3,
          "bench": 4, "cli": 5}
SHARED_MODULES = frozenset({"server.cli.options"})


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a server sub-package from one at its own level or above (other than itself)."""
    problems = []
    for module, targets in sorted(graph.items()):
        parts = module.split(".")
        if parts[0] != "server" or len(parts) < 2 or parts[1] not in LAYERS:
            continue
        for target in sorted(targets):
            other = target.split(".")
            if target in SHARED_MODULES:
                continue
            if other[0] == "server" and len(other) > 1 and other[1] in LAYERS and other[1] != parts[1] \
                    and LAYERS[other[1]] >= LAYERS[parts[1]]:
                problems.append(f"{module} -> {target}")
    return problems


def test_server_packages_import_only_lower_layers() -> None:
    """No module of server/session/ imports server/relay/ (the session is below the transport); the simulation and
    the benches sit above both; the command line above everything."""
    assert layer_violations(import_graph(REPO_ROOT, PACKAGES)) == []


def test_the_layer_check_catches_an_upward_import() -> None:
    graph = {"server.session.session": {"server.relay.state", "runtime.peer"},
             "server.relay.state": {"server.session.session"}, "server.simulation.stragglers": {"server.relay.state"}}
    assert layer_violations(graph) == ["server.session.session -> server.relay.state"]


def documented_paths(text: str) -> list[tuple[str, str]]:
    """(row's first path, a path) for every path named in backticks in a Markdown table row; a later path in
    a row may be relative to the first (``tests/`` ... ``browser/``)."""
    found = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        names = [n for n in re.findall(r"`([\w./-]+)`", line)
                 if "/" in n and not n.startswith(("/", "http")) and not n.endswith(".json")]
        found += [(names[0], name) for name in names]
    return found


def path_exists(base: str, name: str) -> bool:
    folders = [REPO_ROOT, REPO_ROOT / base, REPO_ROOT / base.rstrip("/").rsplit("/", 1)[0], REPO_ROOT / "web"]
    return any((folder / name).exists() for folder in folders)


@pytest.mark.parametrize("document", ["docs/getting-started.md", "docs/architecture.md"])
def test_the_folder_maps_match_the_tree(document: str) -> None:
    """Every path a folder map names exists, and every sub-package of server/ is on the map."""
    text = (REPO_ROOT / document).read_text()
    generated = {"wheels/", "site/"}  # built by set-up, not in a fresh clone
    at_run_time = {"archive/NNN/"}  # made in a session folder
    missing = sorted({name for base, name in documented_paths(text)
                      if base not in generated and name not in at_run_time and not path_exists(base, name)})
    assert missing == [], f"{document} names paths that do not exist: {missing}"
    packages = sorted(p.parent.name for p in (REPO_ROOT / "server").glob("*/__init__.py"))
    unlisted = [name for name in packages if f"server/{name}/" not in text]
    assert unlisted == [], f"{document} does not list server/ sub-packages {unlisted}"
