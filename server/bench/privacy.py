"""``peertrain bench privacy``: what user-level differential privacy costs the model, at epsilon about 1, 3 and 8.

Two local tasks in the simulator (``server.simulation.local_sim``), each with ``--peers`` volunteers who all take part
in every one of ``--rounds`` rounds (k = peers): the CSV example (``examples/csv_task.py`` on rows made by
``examples/make_local_data.py csv``, judged on the host's balanced validation file by accuracy) and bytetext-local (a
small transformer on CPython's help text cut per peer by ``examples/make_local_data.py text``, judged on host text
by validation loss). Per task and seed (``--seeds``): the session without DP (the anchor), then with DP-FedAvg
(aggregate ``mean``, adaptive clipping at the median, ``--clip`` to start) at the noise multiplier dp-accounting
calibrates for each target epsilon after all the rounds (a volunteer is in every round: rounds per unit = rounds),
all from the same package and plan. Prints the final metric beside the anchor's, the round's noise against one
clipped update (z sqrt(d) / m: what decides whether the model can learn through it), and the accountant's epsilon
after every round of each setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from server.harness.relay_process import EXAMPLES
from server.session import accountant
from server.session.config import SessionConfig
from server.session.package import build_package
from server.simulation.local_sim import LocalPeers, judged_value, run_local_session

# Per task: its module, the first clip, and the volunteers and rounds it runs with (bytetext-local's units cost ~0.3 s
# each on this machine's shared cores: 20 volunteers x 8 rounds x 4 settings x 3 seeds is ten minutes).
TASKS: dict[str, dict[str, Any]] = {
    "csv": {"task": str(EXAMPLES / "csv_task.py"), "clip": 0.5, "peers": 30, "rounds": 10},
    "bytetext-local": {"task": "bytetext-local", "clip": 1.0, "peers": 20, "rounds": 8,
                       "settings": {"n_layer": 1, "n_embd": 32, "n_head": 2, "context": 32, "steps": 4,
                                    "batch_size": 8, "validation_windows": 64, "local_eval_windows": 16}},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", default="csv,bytetext-local", help="comma list of " + ", ".join(TASKS))
    parser.add_argument("--epsilons", default="1,3,8", help="target epsilons after all rounds (comma list)")
    parser.add_argument("--delta", type=float, default=1e-6, help="the delta epsilon is given at")
    parser.add_argument("--peers", type=int, help="simulated volunteers, all in every round (default: csv 30, "
                        "bytetext-local 20)")
    parser.add_argument("--rounds", type=int, help="rounds per session, the same with and without DP (default: csv "
                        "10, bytetext-local 8)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per setting")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")


def make_data(kind: str, root: Path, peers: int, seed: int) -> tuple[list[Path], dict[str, Any]]:
    """Peer folders (and the host's validation) from ``examples/make_local_data.py``."""
    spec = importlib.util.spec_from_file_location("make_local_data", EXAMPLES / "make_local_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if kind == "csv":
        module.write_csv(root, peers, 200, seed)
        return sorted((root / "peers").iterdir()), {"validation_file": str(root / "validation.csv")}
    # The last peer's share is the host's validation text; CPython's help text is ~490 kB, so many peers get less.
    module.write_text(root, peers + 1, min(6000, 480_000 // (peers + 1)))
    folders = sorted((root / "peers").iterdir(), key=lambda p: int(p.name.split("-")[1]))
    validation = [str(p) for p in sorted(folders[-1].iterdir())]
    return folders[:-1], {"validation_files": tuple(validation)}


def one_session(task: str, settings: dict[str, Any], folders: list[Path], work: Path,
                config: SessionConfig) -> dict[str, Any]:
    """One session of the local task on the volunteers' ``folders``; its package built with the config's seed."""
    package = build_package(task, settings, work / f"package-{config.seed}", seed=config.seed, log=lambda *_: None)
    peers = LocalPeers.load(package.task, folders)
    session = run_local_session(package, config, peers)
    last = session.history[-1]
    return {"metric": session.metric, "final": judged_value(session, last), "rounds": session.round,
            "accuracy": last["metrics"].get("accuracy"), "size": session.spec.size,
            "epsilons": [entry.get("privacy", {}).get("epsilon") for entry in session.history]}


def run(args: argparse.Namespace) -> int:
    chosen = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in chosen if t not in TASKS]
    if unknown:
        print(f"peertrain bench privacy: unknown task(s) {unknown}; choose from {', '.join(TASKS)}", file=sys.stderr)
        return 2
    targets = [float(e) for e in args.epsilons.split(",") if e]
    figures: dict[str, Any] = {"command": " ".join(sys.argv[1:]), "delta": args.delta, "tasks": {}}
    started = time.perf_counter()
    for name in chosen:
        spec = TASKS[name]
        peers, rounds = args.peers or spec["peers"], args.rounds or spec["rounds"]
        print(f"{name}: {peers} volunteers, all in each of {rounds} rounds; {args.seeds} seeds per setting")
        settings: dict[str, Any] = {**spec.get("settings", {}), "units": peers}
        rows = []
        with tempfile.TemporaryDirectory(prefix="bench-privacy-") as tmp:
            work = Path(tmp)
            folders, extra = make_data("csv" if name == "csv" else "text", work / "data", peers, 0)
            settings |= extra
            for target in [None, *targets]:
                z = None if target is None else accountant.noise_for_epsilon(target, rounds, args.delta)
                config = SessionConfig(participants=len(folders), passes=rounds, max_rounds=rounds, aggregate="mean",
                                       divergence_factor=1e9)
                if z is not None:
                    config = dataclasses.replace(config, dp_noise_multiplier=z, dp_clip=spec["clip"],
                                                 dp_adaptive_clip=0.5, dp_delta=args.delta)
                runs = []
                for seed in range(args.seeds):
                    runs.append(one_session(spec["task"], settings, folders, work,
                                            dataclasses.replace(config, seed=seed)))
                    label = "no DP" if target is None else f"epsilon {target:g} (z {z:.3g})"
                    print(f"  {name}, {label}, seed {seed}: {runs[-1]['metric']} {runs[-1]['final']:.4f} "
                          f"({time.perf_counter() - started:.0f} s)", flush=True)
                finals = [r["final"] for r in runs]
                accuracies = [r["accuracy"] for r in runs if r["accuracy"] is not None]
                # The round's noise against one clipped update: |N(0, (z C / m)^2 I_d)| / C = z sqrt(d) / m.
                ratio = None if z is None else z * runs[0]["size"] ** 0.5 / peers
                rows.append({"target": target, "noise_multiplier": z, "finals": finals, "peers": peers,
                             "noise_to_clip": ratio,
                             "rounds": rounds, "accuracy": statistics.fmean(accuracies) if accuracies else None,
                             "mean": statistics.fmean(finals), "sd": statistics.pstdev(finals),
                             "metric": runs[0]["metric"], "epsilons": runs[0]["epsilons"]})
        figures["tasks"][name] = rows
        report(name, rows)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))
    print(f"bench privacy: {time.perf_counter() - started:.0f} s")
    return 0


def report(name: str, rows: list[dict[str, Any]]) -> None:
    anchor = rows[0]
    print(f"\n{name}: final {anchor['metric']} over {len(anchor['finals'])} seeds, beside the anchor without DP")
    print("| setting | noise multiplier | noise norm / clip | final (mean ± sd) | against no DP | accuracy | "
          "epsilon after each round |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        label = "no DP (anchor)" if row["target"] is None else f"epsilon {row['target']:g}"
        z = "–" if row["noise_multiplier"] is None else f"{row['noise_multiplier']:.3g}"
        eps = "–" if row["target"] is None else ", ".join(f"{e:.2f}" for e in row["epsilons"])
        accuracy = "–" if row["accuracy"] is None else f"{row['accuracy']:.3f}"
        ratio = "–" if row["noise_to_clip"] is None else f"{row['noise_to_clip']:.3g}"
        gap = row["mean"] - anchor["mean"]
        print(f"| {label} | {z} | {ratio} | {row['mean']:.4f} ± {row['sd']:.4f} | {gap:+.4f} | {accuracy} | {eps} |")
