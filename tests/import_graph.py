"""The import graph of the project's packages, read from the source (``ast``), and the cycles in it.

Every import counts: at module level, inside functions (a lazy import only hides a cycle) and under
``if TYPE_CHECKING:`` (a type-only back-reference is still a knot for a reader). A submodule that imports
its own package's ``__init__`` while that ``__init__`` imports it back is a cycle too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of ``packages`` (folders under ``root``)."""
    return {module_name(root, path): path for package in packages for path in sorted((root / package).rglob("*.py"))}


def imported_modules(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The project modules that module ``name`` (file ``path``) imports, resolved against ``known``."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:  # ``import a.b.c`` of something outside the project
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                add(submodule if submodule in known else module)
    return found


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    known = modules_under(root, packages)
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative), each
    sorted, and each given as one closed path through it (``a -> b -> a``) for the message."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            if children:
                child = children.pop(0)
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def closed_path(graph: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    """One cycle through the component's first module, for a readable failure (breadth-first search)."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if child in members and child not in previous and child != start:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component
