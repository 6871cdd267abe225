"""``peertrain bench direction``: the directions of honest updates, per task, to set ``--verify-direction``.

The relay replays an update whose cosine with the previous round's merged pseudo-gradient, or with the mean of
the round's other updates accepted before it, is below a threshold (``server.relay.direction``). This measures
those cosines on honest sessions with the relay's own function (``direction_of``): each session runs in-process
(``task.train_unit`` on every unit, as a browser's worker, results through the session's codec as uploads), and
each round's results arrive in a seeded random order, so "the others" are those accepted before a result, as at
the relay (the first to arrive has none). Printed per task: the honest cosines' distribution (count, min, 1st and
5th percentiles, median) for each reference and for the lower of the two (what the relay compares), and the share
of honest results below each candidate threshold; beside it, what the bench's patient attackers would show in the
same rounds (``inner_product``: global - 0.5 x update, ``free_rider``: no update, cosine 0).

Tasks: arith and bytetext as ``bench attacks`` runs them (k = 3, 2 passes; k = 10, 4 passes for arith), cartpole
(16 episodes a unit, k = 4, 6 rounds), and the non-IID local task of the examples: ``examples/csv_task.py`` on
``examples/data/csv/peers`` (three peers, each holding mostly one of three classes), k = 3, as ``peertrain simulate
--local-data`` runs it. JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.planner import Assignment
from runtime.tasks import UnitResult
from server.paths import REPO_ROOT
from server.relay.direction import direction_of
from server.session.local_files import peer_folders
from server.session.package import build_package
from server.session.session import Session, SessionConfig
from server.simulation.local_sim import LocalPeers
from server.simulation.sweep_worker import one_blas_thread
from server.simulation.uploads import SimulatedUploads

INNER_PRODUCT_EPS = 0.5  # (server.bench.attack_peers: global - 0.5 x update)
THRESHOLDS = (-0.2, -0.1, 0.0, 0.05, 0.1, 0.2)
CSV_TASK = REPO_ROOT / "examples" / "csv_task.py"
CSV_DATA = REPO_ROOT / "examples" / "data" / "csv"
ARITH = {"tokenizer": "char", "epochs": 3, "num_examples": 4000, "chunks": 20, "operand_max": 19, "lr": 0.01,
         "validation_size": 200, "generalization_size": 50, "beyond_range_size": 10}


@dataclass(frozen=True)
class Case:
    name: str
    task: str
    settings: dict[str, Any]
    k: int
    passes: int
    max_rounds: int | None = None
    local: bool = False  # a local task: each unit trained by a simulated peer on its own folder


CASES = (
    Case("arith k=3", "arith", ARITH, 3, 2),
    Case("arith k=10", "arith", ARITH, 10, 4),
    Case("bytetext k=3", "bytetext", {"chunks": 20, "steps": 3, "batch_size": 8, "validation_windows": 64,
                                      "sample_tokens": 8}, 3, 2),
    Case("cartpole k=4", "cartpole", {"episodes_per_unit": 16}, 4, 1, max_rounds=6),
    Case("csv (local, non-IID) k=3", str(CSV_TASK), {"validation_file": str(CSV_DATA / "validation.csv"),
                                                      "units": 3}, 3, 6, local=True),
)


REFERENCES = {"previous": "the previous step", "others": "earlier arrivals' mean",
              "round": "all the round's others", "lowest": "the lower of the first two",
              "inner_product": "inner_product: the lowest of all three"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", help=f"comma list of case names' first words ({', '.join(c.name for c in CASES)}"
                        "; default all)")
    parser.add_argument("--seed", type=int, default=0, help="the sessions' seed and the arrival order's")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/direction.json"), help="figures as JSON")


def session_cosines(case: Case, folder: Path, seed: int) -> dict[str, list[float]]:
    """One honest session of ``case``: per result, its cosine with the previous step, with the earlier arrivals'
    mean, and the lower of the two (where there is one)."""
    package = build_package(case.task, dict(case.settings), folder / "package", seed=seed, log=lambda _: None)
    config = SessionConfig(participants=case.k, passes=case.passes, seed=seed, max_rounds=case.max_rounds)
    train: Callable[[Session, Assignment], UnitResult]
    if case.local:
        peers = LocalPeers.load(package.task, peer_folders([CSV_DATA / "peers"]))
        train = lambda s, a: peers.train(s, a, peers.default_peer(a, case.k))  # noqa: E731
    else:
        train = lambda s, a: s.task.train_unit(s.weights, s.work_unit(a))  # noqa: E731
    rng = np.random.default_rng(seed)
    found: dict[str, list[float]] = {name: [] for name in REFERENCES}
    with one_blas_thread():
        session = Session.create(package, config)
        uploads = SimulatedUploads()
        while not session.done:
            results = [(a, uploads.arrived(session, a, train(session, a))) for a in session.assignments()]
            global64 = session.weights.astype(np.float64)
            updates = [r.weights.astype(np.float64) - global64 for _, r in results]
            previous = session.merge.last_delta
            order = [int(i) for i in rng.permutation(len(updates))]  # the arrival order
            for position, index in enumerate(order):
                earlier = np.sum([updates[j] for j in order[:position]], axis=0) if position else None
                direction = direction_of(updates[index], previous, earlier)
                everyone = np.sum([updates[j] for j in order if j != index], axis=0)  # the round complete
                whole = direction_of(updates[index], None, everyone).others
                attacked = direction_of(-INNER_PRODUCT_EPS * updates[index], previous, everyone).lowest()
                for name, value in (("previous", direction.previous), ("others", direction.others),
                                    ("round", whole), ("lowest", direction.lowest()), ("inner_product", attacked)):
                    if value is not None:
                        found[name].append(value)
            session.complete_round(results)
    return found


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """Count, min, 1st and 5th percentiles, median, and the share below each of THRESHOLDS."""
    if not values:
        return {"count": 0}
    array = np.asarray(values)
    return {"count": len(values), "min": float(array.min()), "p1": float(np.percentile(array, 1)),
            "p5": float(np.percentile(array, 5)), "median": float(np.median(array)),
            "below": {f"{t:g}": float(np.mean(array < t)) for t in THRESHOLDS}}


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def table(figures: dict[str, dict[str, dict[str, Any]]]) -> str:
    """One row per case and reference; the shares below each threshold as percentages."""
    head = ["case", "cosine with", "results", "min", "p1", "p5", "median"] + [f"< {t:g}" for t in THRESHOLDS]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + " |"]
    for case, per_reference in figures.items():
        for reference, d in per_reference.items():
            cells = [case, REFERENCES[reference], str(d.get("count", 0)), fmt(d.get("min")), fmt(d.get("p1")),
                     fmt(d.get("p5")), fmt(d.get("median"))] + \
                [f"{100 * d['below'][f'{t:g}']:.1f}%" if "below" in d else "-" for t in THRESHOLDS]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    wanted = [w.strip() for w in (args.cases or "").split(",") if w.strip()]
    cases = [c for c in CASES if not wanted or c.name.split()[0] in wanted]
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="peertrain-bench-direction-") as folder:
        for number, case in enumerate(cases):
            found = session_cosines(case, Path(folder) / str(number), args.seed)
            per = {name: distribution(values) for name, values in found.items()}
            figures[case.name] = per
            low = per["lowest"]
            print(f"{case.name}: {low.get('count', 0)} honest results, lowest cosine min {fmt(low.get('min'))}, "
                  f"p1 {fmt(low.get('p1'))}, median {fmt(low.get('median'))}", flush=True)
    text = table(figures)
    print()
    print(text)
    print("(free_rider: no update, cosine 0 with every reference)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seed": args.seed, "thresholds": THRESHOLDS, "figures": figures,
                                    "table": text}, indent=1))
    print(f"results: {args.out}")
    return 0
