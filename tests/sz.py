"""The line budget as a report (after tinygrad's ``sz.py``): lines per module, package by package, largest first.

    .venv/bin/python tests/sz.py            every package of runtime/, server/ and tests/
    .venv/bin/python tests/sz.py --marked   only the modules over a target, and the packages' totals

A module over the soft target (``SOFT_TARGET`` lines) is marked ``+``: worth a look for a second concept that wants
its own module. A relay module over ``RELAY_LIMIT`` (the relay's parts stay under it) or any module over
``HARD_LIMIT`` is marked ``!``. ``tests/test_shape.py`` fails on those two and nothing else: the budget is read, not
trimmed to; a module that grows past a target is split by what it holds, never squeezed under the number.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("runtime", "server", "tests")
SOFT_TARGET = 300  # lines: the house style's aim for a module
RELAY_LIMIT = 400  # lines: each part of the relay (server/relay/ and below)
RELAY_FOLDER = "server/relay/"
HARD_LIMIT = 500  # lines: any module (the backstop tests/test_shape.py enforces)


@dataclass(frozen=True)
class Module:
    path: str  # relative to the repository, with forward slashes
    lines: int

    @property
    def package(self) -> str:
        return self.path.rsplit("/", 1)[0]

    @property
    def limit(self) -> int:
        """The most lines this module may have before a test fails."""
        return RELAY_LIMIT if self.path.startswith(RELAY_FOLDER) else HARD_LIMIT

    @property
    def mark(self) -> str:
        """``!`` over its limit, ``+`` over the soft target, else nothing."""
        if self.lines > self.limit:
            return "!"
        return "+" if self.lines > SOFT_TARGET else ""


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def modules(root: Path = REPO_ROOT, folders: Iterable[str] = FOLDERS) -> list[Module]:
    """Every Python module under ``folders`` of ``root`` with its line count, in path order."""
    found = sorted(p for folder in folders for p in (root / folder).rglob("*.py"))
    return [Module(p.relative_to(root).as_posix(), line_count(p)) for p in found]


def over_limit(found: Iterable[Module]) -> list[Module]:
    """The modules a test fails on (over their limit), largest first."""
    return sorted((m for m in found if m.lines > m.limit), key=lambda m: -m.lines)


def report(found: list[Module], *, marked_only: bool = False) -> str:
    """Packages by total lines, largest first, each with its modules by lines, largest first."""
    packages: dict[str, list[Module]] = {}
    for module in found:
        packages.setdefault(module.package, []).append(module)
    width = max((len(m.path) for m in found), default=10)
    out = []
    for package, members in sorted(packages.items(), key=lambda item: -sum(m.lines for m in item[1])):
        total = sum(m.lines for m in members)
        out.append(f"{package + '/':<{width}}  {total:6d}  ({len(members)} modules)")
        for module in sorted(members, key=lambda m: (-m.lines, m.path)):
            if module.mark or not marked_only:
                out.append(f"  {module.path:<{width - 2}}  {module.lines:6d} {module.mark}".rstrip())
    soft = sum(1 for m in found if m.mark == "+")
    hard = over_limit(found)
    out.append(f"\n{sum(m.lines for m in found)} lines in {len(found)} modules; {soft} over the soft target "
               f"({SOFT_TARGET}, +); {len(hard)} over their limit (!: {RELAY_LIMIT} in {RELAY_FOLDER}, "
               f"{HARD_LIMIT} elsewhere)" + "".join(f"\n  ! {m.path}: {m.lines} > {m.limit}" for m in hard))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marked", action="store_true", help="list only the modules over a target")
    parser.add_argument("folders", nargs="*", default=list(FOLDERS), help=f"folders to count (default: {FOLDERS})")
    args = parser.parse_args(argv)
    print(report(modules(REPO_ROOT, args.folders), marked_only=args.marked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
