"""``peertrain simulate``: whole sessions in-process with the same runtime code a browser runs; compares merges."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from server.cli.options import (
    add_buffer_option,
    add_config_option,
    add_metrics_options,
    add_sweep_options,
    add_task_options,
    merge_names,
    metrics_targets,
    parse_sets,
    read_settings,
    sweep_settings,
)
from server.session.settings import add_flags

HELP = "run training sessions in-process, without browsers; compare merge methods"
DESCRIPTION = ("Run sessions in-process with the same runtime code a browser runs. Several --merge choices run from "
               "the same initial weights and chunk order and are compared in one plot and one table. The sessions "
               "run in parallel on a local process pool (--workers N), or as Ray tasks with --ray (a Ray instance "
               "of this machine) or --ray HEAD:6379 (a cluster's machines); the results are the same bits.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from server.relay.options import RelayOptions
    from server.session.config import SessionConfig

    add_task_options(parser, seed=False)
    parser.add_argument("--package", type=Path, help="a built package folder (instead of --task/--set)")
    parser.add_argument("--local-data", action="append", type=Path, default=[], metavar="DIR",
                        help="local tasks: a simulated peer's own files, one folder per peer (repeatable), or one "
                        "folder holding a sub-folder per peer; slot s of round r goes to peer (r*k + s) mod P")
    add_config_option(parser, "simulate")
    # Not serve's --merge (one method, its settings in --merge-config): simulate compares several from the same
    # start, so it takes a list, each choice with its own settings; a --config file's merge and [merge_config]
    # are the one choice when no --merge is given.
    parser.add_argument("--merge", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                        help=f"the merges to compare: {', '.join(merge_names())}; repeatable or a comma list; settings "
                        "per choice, e.g. fedavgm:server_momentum=0.5 (default fedavg, or a --config file's merge "
                        "with its [merge_config])")
    group = parser.add_argument_group("merge hyperparameters (applied to every chosen method that takes them)")
    group.add_argument("--server-lr", dest="server_learning_rate", type=float,
                       help="FedAvg/FedAvgM server learning rate (FedAvg: new = global + lr * (average - global))")
    group.add_argument("--server-momentum", type=float, help="FedAvgM server momentum")
    group.add_argument("--nesterov", action="store_const", const=True, help="FedAvgM: Nesterov momentum")
    group.add_argument("--eta", type=float, help="FedAdam/FedYogi/FedAdagrad step size")
    group.add_argument("--beta1", dest="beta_1", type=float, help="FedAdam/FedYogi/FedAdagrad first-moment decay")
    group.add_argument("--beta2", dest="beta_2", type=float,
                       help="FedAdam/FedYogi second-moment decay (FedAdagrad sums instead)")
    group.add_argument("--tau", type=float, help="FedAdam/FedYogi/FedAdagrad adaptivity (added to sqrt(v))")
    group.add_argument("--no-bias-correction", dest="bias_correction", action="store_const", const=False,
                       help="FedAdam/FedYogi/FedAdagrad without bias correction (the paper's Algorithm 2)")
    session = parser.add_argument_group("the session (server.session.config.SessionConfig; a --config file's keys)")
    stragglers = straggler_group(parser)
    privacy = parser.add_argument_group("user-level differential privacy (docs/sessions/privacy.md)")
    add_flags(parser, SessionConfig, "simulate", groups={"": session, "async": stragglers, "privacy": privacy})
    parser.add_argument("--out", type=Path, default=Path("runs/simulate"), help="output folder")
    add_metrics_options(parser, "--out")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_sweep_options(parser)
    add_flags(parser, RelayOptions, "simulate", groups={"rounds": stragglers})
    add_straggler_arguments(stragglers)


def straggler_group(parser: argparse.ArgumentParser) -> Any:
    return parser.add_argument_group(
        "slow peers on a virtual clock (with --peer-speeds: a real relay in-process, its backups, deadlines and "
        "leases on virtual time, as serve's options of the same names; units are trained for real)")


def add_straggler_arguments(group: Any) -> None:
    """``--peer-speeds`` and what goes with it besides the relay's settings: the relay's own decisions on a virtual
    clock (``server.simulation.stragglers``)."""
    group.add_argument("--peer-speeds", metavar="PROFILE",
                       help="equal; one-slow[:F] (the first peer F times slower, default 4); lognormal[:S] (slowness "
                       "factors exp(N(0, S)), seeded, default 0.5); dropout[:P] (a share P of the peers, at least one, "
                       "vanish once mid-unit and come back --away-seconds later, default 0.2)")
    group.add_argument("--peers", type=int, help="simulated peers (default k)")
    group.add_argument("--unit-seconds", type=float, default=10.0,
                       help="virtual seconds a unit takes on a peer of speed 1 (default 10)")
    add_buffer_option(group)
    group.add_argument("--hold-seconds", type=float, metavar="S",
                       help="a waiting peer asks again after S virtual seconds unless the relay's work changes, as a "
                       "browser's held request (15 s by default in serve); default: the relay's retry, 1 s")
    group.add_argument("--away-seconds", type=float,
                       help="dropout: virtual seconds a vanished peer stays away (default: one lease; inf: never back)")
    group.add_argument("--target", type=float, metavar="METRIC",
                       help="also report the virtual time of the first validation at or past this metric")


MERGE_OPTIONS = ("server_learning_rate", "server_momentum", "nesterov", "eta", "beta_1", "beta_2", "tau",
                 "bias_correction")


def run(args: argparse.Namespace) -> int:
    """``peertrain simulate``: build (or load) the package, run the comparison, report. 2 on a refused set-up."""
    from runtime.merge import MergeError
    from runtime.planner import PlanError
    from runtime.tasks import TaskError
    from server.session.config import SessionConfig, SessionError
    from server.session.package import Package, build_package
    from server.simulation.simulator import MergeChoice, compare, parse_merge_choices, with_common_settings
    from server.simulation.sweep import SweepError

    def fail(error: Exception) -> int:
        print(f"peertrain simulate: {error}", file=sys.stderr)
        return 2

    try:
        config_values, relay_values = read_settings(args, "simulate", file_also=("merge", "merge_config"))
    except SessionError as error:
        return fail(error)
    misplaced = misplaced_options(args, config_values, relay_values)
    if args.peer_speeds is None and misplaced:
        return fail(ValueError(f"{', '.join(misplaced)} only apply with --peer-speeds"))
    parallel = [option for option, given in (("--workers", args.workers is not None), ("--ray", args.ray is not None))
                if given]
    if args.peer_speeds is not None and parallel:
        return fail(ValueError(f"{', '.join(parallel)} do not apply with --peer-speeds (its sessions run here, one "
                               "after another)"))
    round_log = None
    try:
        common = {name: getattr(args, name) for name in MERGE_OPTIONS if getattr(args, name, None) is not None}
        merge, merge_config = config_values.pop("merge", None), config_values.pop("merge_config", {})
        named = parse_merge_choices(args.merge) if args.merge or merge is None else \
            [MergeChoice(merge, dict(merge_config))]
        choices = with_common_settings(named, common)
        SessionConfig(**config_values)  # (settings that cannot go together are refused before anything is built)
        targets = metrics_targets(args, Path(args.out))  # (a folder or store that cannot be used: refused here too)
        round_log = targets.log() if targets is not None else None
        if args.package is not None:
            package = Package.load(args.package)
        else:
            package = build_package(args.task, parse_sets(args.sets), Path(args.out) / "package",
                                    seed=config_values.get("seed", 0))
        config, options = simulated_settings(config_values, relay_values, package)
        if args.local_data or package.task.kind == "local":  # (server.simulation.local_sim)
            return run_local(args, package, choices, config, fail, round_log)
        if args.peer_speeds is not None:
            return run_stragglers(args, straggler_settings(args, options, config.seed), package, choices, config,
                                  round_log)
        comparison = compare(package, choices, config, out=args.out, progress=args.progress, round_log=round_log,
                             **sweep_settings(args))
    except (MergeError, PlanError, TaskError, SessionError, SweepError, FileNotFoundError, ValueError) as error:
        return fail(error)
    finally:
        if round_log is not None:
            round_log.close()
    stopped = [s for s in comparison.sessions if s.stopped]
    for session in stopped:
        print(f"{session.config.name}: stopped: {session.stopped}", file=sys.stderr)
    return 0


def simulated_settings(config_values: dict[str, Any], relay_values: dict[str, Any], package: Any) -> tuple[Any, Any]:
    """The session's config (k: 5, or the package's units if fewer, unless set) and the simulated relay's options
    (no host replays: the simulator trains natively; no bans), through the rules every session start obeys."""
    from server.relay.options import RelayOptions
    from server.session.config import SessionConfig
    from server.session.rules import resolve
    from server.session.settings import declared

    if "participants" not in config_values:
        config_values = {**config_values, "participants": min(declared(SessionConfig)["participants"].default,
                                                              package.data.num_units)}
    options = RelayOptions(admin_token="simulate", verify=False, ban_addresses=False, **relay_values)
    resolved = resolve(SessionConfig(**config_values), options, package)
    for note in resolved.notes:
        print(note)
    return resolved.config, resolved.options


def run_local(args: argparse.Namespace, package: Any, choices: list[Any], config: Any, fail: Any,
              round_log: Any = None) -> int:
    """``simulate --local-data``: a local task's sessions, each simulated peer training on its own folder."""
    from server.simulation.local_sim import simulate_local

    if package.task.kind != "local":
        return fail(ValueError(f"--local-data is for local tasks; {package.task.name} is a {package.task.kind} task"))
    if not args.local_data:
        return fail(ValueError(f"{package.task.name} trains on peers' own files: give each simulated peer a folder "
                               "with --local-data DIR (repeatable, or one folder of per-peer sub-folders)"))
    if args.peer_speeds is not None or getattr(args, "workers", None) is not None or \
            getattr(args, "ray", None) is not None:
        return fail(ValueError("--local-data sessions run here one after another, without --peer-speeds, --workers "
                               "or --ray"))
    sessions = simulate_local(package, choices, args.local_data, config, out=args.out, progress=args.progress,
                              round_log=round_log)
    for session in sessions:
        if session.stopped:
            print(f"{session.config.name}: stopped: {session.stopped}", file=sys.stderr)
    return 0


# simulate's own options that only apply with --peer-speeds: given or not
STRAGGLER_OPTIONS = {
    "--peers": lambda a: a.peers is not None, "--unit-seconds": lambda a: a.unit_seconds != 10.0,
    "--hold-seconds": lambda a: a.hold_seconds is not None, "--away-seconds": lambda a: a.away_seconds is not None,
    "--target": lambda a: a.target is not None, "--buffer": lambda a: a.buffer is not None,
}
ASYNC_SETTINGS = ("staleness_exponent", "max_staleness", "validate_every")


def misplaced_options(args: argparse.Namespace, config_values: dict[str, Any],
                      relay_values: dict[str, Any]) -> list[str]:
    """What was asked for (a flag or the --config file) that only a --peer-speeds run has: the simulated relay's
    settings, async mode and its settings, and simulate's own straggler options."""
    from server.relay.options import RelayOptions
    from server.session.config import SessionConfig
    from server.session.settings import flag_name

    asked = [flag_name(RelayOptions, name) for name in relay_values]
    if config_values.get("mode", "sync") != "sync":
        asked.append("--mode")
    asked += [flag_name(SessionConfig, name) for name in ASYNC_SETTINGS if name in config_values]
    return asked + [option for option, given in STRAGGLER_OPTIONS.items() if given(args)]


def straggler_settings(args: argparse.Namespace, options: Any, seed: int) -> Any:
    """The ``StragglerSettings`` the options ask for (the relay's settings already checked and resolved); a
    ValueError names a bad one of simulate's own."""
    from server.simulation.stragglers import StragglerSettings, parse_profile

    checks = [(args.peers is None or args.peers >= 1, "--peers must be 1 or more"),
              (args.unit_seconds > 0, "--unit-seconds must be above 0"),
              (args.away_seconds is None or args.away_seconds >= 0, "--away-seconds must be 0 or more"),
              (args.hold_seconds is None or args.hold_seconds > 0, "--hold-seconds must be above 0")]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    return StragglerSettings(profile=parse_profile(args.peer_speeds), peers=args.peers, unit_seconds=args.unit_seconds,
                             backup_after=options.backup_after, round_deadline=options.round_deadline,
                             min_results=options.min_results, lease_seconds=options.lease_seconds,
                             hold_seconds=args.hold_seconds, away_seconds=args.away_seconds, seed=seed)


def run_stragglers(args: argparse.Namespace, settings: Any, package: Any, choices: list[Any], base: Any,
                   round_log: Any = None) -> int:
    """``simulate --peer-speeds``: one session per merge choice through the relay on a virtual clock; a line per
    round, then the virtual times. Checkpoints, history and the relay's SQLite file go in ``--out``/NAME/."""
    import json

    from server.simulation.simulator import choice_config
    from server.simulation.stragglers import TrainingMemo, simulate_stragglers

    memo = TrainingMemo()
    asynchronous = base.mode == "async"
    participants = base.participants  # (async: --buffer, as serve)
    word = "merge" if asynchronous else "round"

    def progress(entry: dict[str, Any], at: float, simulation: Any) -> None:
        if not args.progress:
            return
        session = simulation.relay.session
        value = entry["metrics"].get(session.metric)
        shown = f"{value:.4g}" if isinstance(value, int | float) else "not validated"
        extras = [f"carried {len(entry['carried'])}" if entry.get("carried") else "",
                  f"backups won {len(entry['backups']['won'])}/{len(entry['backups']['units'])}"
                  if entry.get("backups") else ""]
        print(f"{word} {entry['round'] + 1}/{session.num_rounds} at {at:.1f} virtual s: {session.metric} {shown} "
              f"({entry['participants']} results{''.join(', ' + e for e in extras if e)})", flush=True)

    for choice in choices:
        config = choice_config(base, choice)
        folder = Path(args.out) / choice.slug
        run = simulate_stragglers(package, config, settings, folder, session_dir=folder, memo=memo, on_round=progress,
                                  round_log=round_log)
        backups = "off" if settings.backup_after is None or asynchronous else \
            f"after {settings.backup_after:g}x the median unit"
        deadline = f", deadline {settings.round_deadline:g} s" if settings.round_deadline else ""
        speeds = ", ".join(f"x{f:.3g}" for f in run.factors)
        print(f"{choice.label}: {run.profile} ({len(run.factors)} peers at {speeds}"
              f"{', vanishing: ' + ', '.join(map(str, run.dropouts)) if run.dropouts else ''}), "
              f"{'async, buffer' if asynchronous else 'k'}={participants}, "
              f"units of {settings.unit_seconds:g} s, backups {backups}{deadline}")
        refused = ", ".join(f"{code} {n}" for code, n in run.refused.items()) or "none"
        print(f"  {run.rounds} {word}s (planned {run.planned_rounds}) in {run.virtual_seconds:.1f} virtual s "
              f"({run.real_seconds:.1f} s real){'' if run.done else '; STALLED before the end'}; backups "
              f"{run.backups_handed_out} handed out, {run.backups_won} won; {run.units_carried} units carried; "
              f"{run.units_done} units done for {run.units_merged} merged; refused: {refused}")
        final = run.final_metric
        line = f"  final {run.metric} {final:.4g}" if final is not None else f"  final {run.metric} -"
        if args.target is not None:
            reached = run.time_to(args.target)
            line += f"; {args.target:g} reached at {reached:.1f} virtual s" if reached is not None else \
                f"; {args.target:g} never reached"
        print(line)
        (folder / "stragglers.json").write_text(json.dumps(run.summary(), indent=1) + "\n")
    return 0
