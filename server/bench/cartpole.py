"""``peertrain bench tasks`` (CartPole part): rounds until the greedy return first reaches 500.

The claim under test: with two participants playing 32 episodes each per round, the greedy return went from
about 9 to 500 within 25 to 30 rounds. Here, per seed, an in-process ``server.session.Session`` runs the round
``peertrain serve`` runs: the package built with that seed, the session's own config (``SessionConfig``: the
merge, FedAvg by default, after serve's default aggregator, centered clipping), every participant training its
unit from the same global weights (``server.simulation.sweep_worker.run_round``, what the simulator runs), the
merged policy validated by the session on the task's fixed seeded episodes.
Printed per seed: the first round (counting from 1) whose greedy return is 500, the final greedy
return, seconds per round; then how many seeds reached 500 within the round limit (target: 4 of 5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.session.config import DEFAULT_AGGREGATE
from server.session.package import build_package
from server.session.session import Session, SessionConfig
from server.simulation.sweep_worker import one_blas_thread, run_round
from server.simulation.uploads import SimulatedUploads

SOLVED_RETURN = 500.0
TARGET_SEEDS = 4


@dataclass
class SessionRecord:
    seed: int
    greedy_returns: list[float] = field(default_factory=list)  # after each round
    seconds: list[float] = field(default_factory=list)  # per round: training, merging and validating

    @property
    def first_solved_round(self) -> int | None:
        """The first round (1-based) whose greedy return reached 500, or None."""
        for index, value in enumerate(self.greedy_returns):
            if value >= SOLVED_RETURN:
                return index + 1
        return None


def run_session(settings: Mapping[str, Any], config: SessionConfig, *, stop_when_solved: bool = False) -> SessionRecord:
    """One in-process session of ``config.max_rounds`` rounds (its passes: as many as they take), as ``serve`` runs
    it: the session's assignments -> train_unit -> aggregate and merge -> validate. The package is built with the
    config's seed."""
    assert config.max_rounds is not None, "a CartPole run is a number of rounds"
    record = SessionRecord(config.seed)
    with tempfile.TemporaryDirectory(prefix="peertrain-cartpole-") as folder:
        package = build_package("cartpole", dict(settings), Path(folder) / "package", seed=config.seed, check=False,
                                log=lambda _: None)
        passes = -(-config.max_rounds * config.participants // package.data.num_units)
        config = dataclasses.replace(config, passes=passes)
        with one_blas_thread():
            session = Session.create(package, config)
            uploads = SimulatedUploads()
            while not session.done:
                start = time.perf_counter()
                entry = run_round(session, uploads)
                record.seconds.append(time.perf_counter() - start)
                record.greedy_returns.append(float(entry["metrics"]["greedy_return"]))
                if stop_when_solved and record.greedy_returns[-1] >= SOLVED_RETURN:
                    break
    return record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Prefixed: ``peertrain bench tasks`` hands the same arguments to every task's bench.
    parser.add_argument("--cartpole-seeds", type=int, default=5, help="sessions, seeded 0, 1, ... (default 5)")
    parser.add_argument("--cartpole-rounds", type=int, default=30, help="round limit per session (default 30)")
    parser.add_argument("--cartpole-participants", type=int, default=2, help="participants per round (default 2)")
    parser.add_argument("--cartpole-episodes", type=int, default=32, help="episodes per unit (default 32)")
    parser.add_argument("--cartpole-merge", default="fedavg", help="merge method (default fedavg)")
    parser.add_argument("--cartpole-set", dest="cartpole_sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a cartpole task setting, repeatable (e.g. --cartpole-set lr=0.02)")
    parser.add_argument("--cartpole-full", action="store_true", help="keep playing every round after reaching 500")
    parser.add_argument("--cartpole-out", type=Path, default=None, help="write the figures as JSON here")


def run(args: argparse.Namespace) -> int:
    from server.cli.options import parse_sets

    settings: dict[str, Any] = {"episodes_per_unit": args.cartpole_episodes, **parse_sets(args.cartpole_sets)}
    rounds, participants, merge = args.cartpole_rounds, args.cartpole_participants, args.cartpole_merge
    print(f"cartpole: {participants} participants x {settings['episodes_per_unit']} episodes per round, {merge} "
          f"after {DEFAULT_AGGREGATE} (serve's round), "
          f"up to {rounds} rounds; settings {json.dumps(settings)}")
    solved, figures = 0, []
    for seed in range(args.cartpole_seeds):
        config = SessionConfig(merge=merge, participants=participants, seed=seed, max_rounds=rounds)
        record = run_session(settings, config, stop_when_solved=not args.cartpole_full)
        first = record.first_solved_round
        solved += first is not None
        per_round = sum(record.seconds) / len(record.seconds)
        curve = " ".join(f"{value:.0f}" for value in record.greedy_returns)
        print(f"  seed {seed}: 500 at round {first or 'never'}, final {record.greedy_returns[-1]:.0f}, "
              f"{per_round:.2f} s/round over {len(record.seconds)} rounds  [{curve}]")
        figures.append({"seed": seed, "first_solved_round": first, "greedy_returns": record.greedy_returns,
                        "seconds_per_round": per_round})
    verdict = "ok" if solved >= min(TARGET_SEEDS, args.cartpole_seeds) else "MISSED"
    print(f"cartpole: {solved} of {args.cartpole_seeds} seeds reached 500 within {rounds} rounds "
          f"(target {TARGET_SEEDS} of 5): {verdict}")
    if args.cartpole_out is not None:
        args.cartpole_out.parent.mkdir(parents=True, exist_ok=True)
        args.cartpole_out.write_text(json.dumps({"settings": settings, "rounds": rounds, "participants": participants,
                                                 "merge": merge, "solved": solved, "seeds": figures}, indent=1))
    return 0
