"""``peertrain bench NAME``: the benchmarks. They measure and write figures; tests assert behaviour.

Each benchmark is a module exposing ``add_arguments(parser)`` and ``run(args) -> int``. ``BENCHES``
maps a name to its module(s); ``tasks`` runs several. A module that does not exist yet makes the
bench say "not built yet" and exit 2. Modules are imported only when their bench runs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

BENCHES: dict[str, tuple[str, ...]] = {
    "runtime": ("server.bench.runtime",),
    "tasks": ("server.bench.arith", "server.bench.cartpole"),
    "merges": ("server.bench.merges",),
    "relay": ("server.bench.relay",),
    "webgpu": ("server.bench.webgpu",),
    "attacks": ("server.bench.attacks",),
    "replay": ("server.bench.replay",),
    "stragglers": ("server.bench.stragglers",),
    "fuzz": ("server.bench.fuzz",),
    "chaos": ("server.bench.chaos",),
    "disk": ("server.bench.disk",),
    "load": ("server.bench.load",),
    "comm": ("server.bench.comm",),
    "privacy": ("server.bench.privacy",),
    "workers": ("server.bench.workers",),
    "hidden-tab": ("server.bench.hidden_tab",),
    "direction": ("server.bench.direction",),
    "crowd": ("server.bench.crowd",),
    "capacity": ("server.bench.capacity",),
    "demo": ("server.bench.demo",),
}


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def summary() -> str:
    """One line per bench, saying which are built."""
    lines = []
    for name, modules in BENCHES.items():
        built = [m.rsplit(".", 1)[1] for m in modules if available(m)]
        state = "not built yet" if not built else ("runs " + ", ".join(built) if len(modules) > 1 else "built")
        lines.append(f"  {name:8s} {state}")
    return "\n".join(lines)


def run_bench(name: str, argv: Sequence[str]) -> int:
    """Run bench ``name`` with its own command-line arguments ``argv``."""
    if name not in BENCHES:
        print(f"peertrain bench: unknown bench {name!r}; choose one of {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    modules = [m for m in BENCHES[name] if available(m)]
    if not modules:
        print(f"peertrain bench {name}: not built yet.", file=sys.stderr)
        return 2
    loaded = [importlib.import_module(m) for m in modules]
    if len(loaded) == 1:
        parser = argparse.ArgumentParser(prog=f"peertrain bench {name}", description=loaded[0].__doc__)
        loaded[0].add_arguments(parser)
        return int(loaded[0].run(parser.parse_args(list(argv))))
    return run_several(name, loaded, argv)


def run_several(name: str, loaded: Sequence, argv: Sequence[str]) -> int:
    """Run each module with the arguments it knows; an argument no module knows is an error."""
    parsed, leftovers = [], []
    for module in loaded:
        parser = argparse.ArgumentParser(prog=f"peertrain bench {name} ({module.__name__.rsplit('.', 1)[1]})")
        module.add_arguments(parser)
        args, rest = parser.parse_known_args(list(argv))
        parsed.append(args)
        leftovers.append(set(rest))
    unknown = set.intersection(*leftovers)
    if unknown:
        print(f"peertrain bench {name}: no bench takes {' '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    status = 0
    for module, args in zip(loaded, parsed, strict=True):
        print(f"== {module.__name__} ==")
        status = max(status, int(module.run(args)))
    return status
