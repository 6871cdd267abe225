"""``peertrain bench attacks``: poisoned uploads against a real relay, per aggregator, against honest anchors.

Each run is a ``peertrain serve`` subprocess (a fresh session on a package built once per task) and k native
peers in this process that speak the documented HTTP API (``server.bench.attack_peers``): honest peers train
with ``runtime.peer.Peer``; attackers train honestly and then replace their upload (noise_claim, flip,
free_rider, scaled, little_is_enough, inner_product), or, for sybil, one client address joins 10 extra times
beside the k honest peers and the admitted joins upload flip. Every peer has its own client address, sent as
X-Forwarded-For to a relay that trusts 127.0.0.1 as its proxy (``--forwarded-allow-ips``; all traffic goes to
127.0.0.1).

Reported per run: the final metric against the honest run with the same aggregator (and relay checks) and
against the honest run with ``mean`` (plain FedAvg), the relay's refusals by code (``/api/session``
counters ``refused.*``) and the peers it banned, the joins refused (sybil), the relay's merge time per round
(history ``seconds.merge``, the aggregator's time is in it) and its wall time per round (the last upload ->
the next round's first assignment: checks, replays it waits for, merge, validation). Arith's metric is exact
answers (accuracy, compared in points), bytetext's the validation loss (compared as a ratio). One progress
line per run, a Markdown table per section, JSON in ``--out``.

The verification section crosses host replay shares (``--verify-shares``, default 0,0.1,0.25,1: the relay's
``--verify-fraction``; 0 is ``--no-verify``, no replay at all, not even of first results) and reports, per run:
the attackers caught (banned by the relay / attackers, from ``GET /api/admin/peers``), the round each attacker
was banned in (counted from 0: the round open at its ``banned_at``, against the history's round end times; see
``attack_runs.ban_round``), the honest peers banned (must be 0: a WARNING line says otherwise), the time a merge
waited for its round's replays (history ``verification.waited_seconds``, mean per round) and the session's wall
time per round, also as a ratio to the same run at share 0.

The grid (k = 10) is in sections (``FULL``); runs shared by sections (the honest ones) run once, and
``default`` is left out of a section that runs the aggregator it names with the same settings:

1. arith, the relay as shipped (its checks: example counts, outlier factor 3, host replay of every peer's
   first result and of 10% more, bans): mean and the default aggregator, all six attacks at 30% (3 of 10);
2. the same, attackers honest on their first upload (so the replay of first results does not catch them):
   flip, free_rider, scaled, little_is_enough and inner_product (Xie et al. 2020: global - 0.5 x update) at 20%
   and 40%;
3. arith, the aggregators alone (``--outlier-factor 0 --no-verify``): mean, median, trimmed_mean, krum,
   multikrum, centered_clipping and default, each with its honest run, the same four attacks at 30%;
4. bytetext, the relay as shipped: mean and default, all six attacks at 30%;
5. verification: arith, the default aggregator, attackers honest on their first upload (so only sampled
   replays, and the replays of outliers, can catch them): an honest run, flip, free_rider, scaled and
   little_is_enough at 30%, each at every replay share;
6. and 7. (``patient-bytetext``, ``patient-cartpole``): bytetext and CartPole, the relay as shipped (replays on the
   browser's engine, compared bit for bit), the default aggregator, attackers honest on their first upload:
   free_rider, scaled, flip and little_is_enough at 30%, with the verification columns. Where the relay refuses
   results trained on another engine than its replays' (these two tasks on Pyodide), the bench's peers train on
   that engine too (``attack_training``), as pages do; ``--replay-engine`` picks it.

(noise_claim is left out of 2, 3 and 5: its claim is refused, and its peer banned, by a check without a switch.)

Tasks: arith (chars, operands 0-19, 4000 problems in 20 chunks, 3 local epochs, lr 0.01, 4 passes = 8
rounds; honest FedAvg ends near 70% exact answers), bytetext (bytelm-2.3mb, 20 chunks, 3 steps of 8 windows
per unit, 3 passes = 6 rounds), cartpole (40 units of 16 episodes a pass, 2 passes = 8 rounds; greedy return
over 20 episodes, higher is better). little_is_enough uses z = 1 (``--lie-z paper``: Baruch et al.'s z_max for n
and f, which is 0 for one attacker in ten). Any of ``--tasks --aggregators --attacks --fractions
--relay-checks --honest-first`` replaces the grid by one section per task crossing what they name (what they
leave out: every task, aggregator and attack, fractions 0.1-0.4), and with ``--verify-shares`` also the replay
shares. ``--sections`` (names: shipped, honest-first, alone, bytetext, verification, patient-bytetext,
patient-cartpole) runs those sections of the
grid alone; then those options replace what the sections name instead (e.g. ``--sections verification --attacks
flip,scaled --verify-shares 0,0.25,1``). ``--quick`` (CI): arith, k = 3, 2 passes (14 rounds), one attacker
in three, flip, noise_claim and free_rider, mean and default: 8 runs; and one verification run, free_rider
honest on its first upload at replay share 1 (the sampled replay of its second result must ban it).

Training runs in ``--jobs`` processes (default 2) with one BLAS thread each, as do the relays started here
(OPENBLAS_NUM_THREADS=1): two BLAS threads per process were 2-7x slower on these small models. A budget
(``--budget-s``) stops launching runs once spent and lists those not run.

Timings on this machine (2 cores, shared): see TIMINGS.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from server.bench.attack_peers import ATTACKS, UPLOAD_ATTACKS, RunSpec
from server.bench.attack_report import compare, print_progress, tables
from server.bench.attack_runs import ADMIN, RelayFeatures, RunRecord, one_run, relay_features, serve_command
from server.bench.attack_training import BLAS_THREADS, Trainer
from server.browser_assets import engines
from server.session.package import Package, build_package

TIMINGS = ("the full grid before the verification section: 88 runs in 1,765 s, two at a time (2026-12-01); the "
           "verification section alone (--sections verification): 20 runs in 588 s, so the whole grid needs "
           "--budget-s 2400 or so")
AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multikrum", "centered_clipping", "default")
FRACTIONS = (0.1, 0.2, 0.3, 0.4)
VERIFY_SHARES = (0.0, 0.1, 0.25, 1.0)
MAX_FAILURES_IN_A_ROW = 3  # a relay that will not start stops the bench instead of failing every run


@dataclass(frozen=True)
class TaskGrid:
    task: str
    settings: dict[str, Any]
    passes: int
    quick_passes: int
    metric: str
    points: bool  # compare in points of a 0-1 metric (higher is better), else as a ratio
    label: str  # what the tables say of the metric


TASKS = {
    "arith": TaskGrid("arith", {"tokenizer": "char", "epochs": 3, "num_examples": 4000, "chunks": 20,
                                "operand_max": 19, "lr": 0.01, "validation_size": 200,
                                "generalization_size": 50, "beyond_range_size": 10},
                      passes=4, quick_passes=2, metric="accuracy", points=True,
                      label="exact answers"),
    "bytetext": TaskGrid("bytetext", {"chunks": 20, "steps": 3, "batch_size": 8, "validation_windows": 64,
                                      "sample_tokens": 8},
                         passes=3, quick_passes=1, metric="val_loss", points=False, label="lower is better"),
    # 40 units of 16 episodes a pass: 4 rounds of k = 10; greedy return over 20 episodes, 500 is solved
    "cartpole": TaskGrid("cartpole", {"units": 40, "episodes_per_unit": 16}, passes=2, quick_passes=1,
                         metric="greedy_return", points=False, label="higher is better, 500 is solved"),
}


@dataclass(frozen=True)
class Section:
    """A part of the grid: one task, its aggregators x attacks x fractions, against one relay set-up."""

    title: str
    task: str
    aggregators: tuple[str, ...]
    attacks: tuple[str, ...]
    fractions: tuple[float, ...]
    checks: str = "on"  # "off": the relay's switchable result checks off (attack_runs.CHECKS_OFF)
    honest_first: int = 0  # attackers upload their first N results honestly
    name: str = ""  # what --sections calls it
    # host replay shares crossed (0: --no-verify; None in it: the relay's default); None: the relay's, other columns
    verify_shares: tuple[float | None, ...] | None = None
    anchors: bool = True  # with the honest runs (a verification section: one per share)


SHIPPED, PATIENT = "the relay as shipped", "the relay as shipped; attackers honest on their first upload"
ALONE = "the aggregators alone: outlier check and host replays off"
VERIFYING = "host replays at each share; attackers honest on their first upload"
# noise_claim's claim is refused by a check without a switch (and its peer banned), whatever comes first or after
MOVING = tuple(a for a in UPLOAD_ATTACKS if a not in ("noise_claim", "inner_product"))
# inner_product (a patient attacker's, issue 26) runs where attackers wait: in the section of those honest at first
SHIPPED_ATTACKS = tuple(a for a in ATTACKS if a != "inner_product")
PATIENT_ATTACKS = ("free_rider", "scaled", "flip", "little_is_enough")
FULL_K = 10
FULL = (
    Section(SHIPPED, "arith", ("mean", "default"), SHIPPED_ATTACKS, (0.3,), name="shipped"),
    Section(PATIENT, "arith", ("mean", "default"), (*MOVING, "inner_product"), (0.2, 0.4), honest_first=1,
            name="honest-first"),
    Section(ALONE, "arith", AGGREGATORS, MOVING, (0.3,), checks="off", name="alone"),
    Section(SHIPPED, "bytetext", ("mean", "default"), SHIPPED_ATTACKS, (0.3,), name="bytetext"),
    Section(VERIFYING, "arith", ("default",), MOVING, (0.3,), honest_first=1, name="verification",
            verify_shares=VERIFY_SHARES),
    # bytetext and CartPole, replayed bit for bit on the browser's engine (the peers train there too), against the
    # attackers that wait out the replay of first results: with the verification columns, at the relay's own share
    *(Section(PATIENT, task, ("default",), PATIENT_ATTACKS, (0.3,), honest_first=1, name=f"patient-{task}",
              verify_shares=(None,)) for task in ("bytetext", "cartpole")),
)
QUICK_K = 3
QUICK = (Section(SHIPPED, "arith", ("mean", "default"), ("flip", "noise_claim", "free_rider"), (0.34,),
                 name="shipped"),
         Section(VERIFYING, "arith", ("default",), ("free_rider",), (0.34,), honest_first=1, name="verification",
                 verify_shares=(1.0,), anchors=False))
SECTION_NAMES = tuple(s.name for s in FULL)


def shares(text: str) -> list[float]:
    """``0,0.1,1`` -> [0.0, 0.1, 1.0], each in [0, 1]."""
    values = [float(part) for part in text.split(",") if part.strip()]
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"replay shares are numbers from 0 to 1, not {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = lambda text: [part.strip() for part in text.split(",") if part.strip()]  # noqa: E731
    parser.add_argument("--quick", action="store_true", help="the CI grid: arith, k=3, one attacker in three, "
                        "flip/noise_claim/free_rider, mean and the default aggregator; and free_rider honest on "
                        "its first upload at replay share 1")
    parser.add_argument("--sections", type=names, help="run only these sections of the grid (comma list of "
                        f"{', '.join(SECTION_NAMES)}); --tasks --aggregators --attacks --fractions --relay-checks "
                        "--honest-first --verify-shares then replace what they name in them")
    parser.add_argument("--verify-shares", type=shares,
                        help="host replay shares the verification section crosses (the relay's --verify-fraction; "
                        f"0: --no-verify, no replay at all; default {','.join(f'{v:g}' for v in VERIFY_SHARES)}); "
                        "with the options that replace the grid, its sections cross them too")
    parser.add_argument("--tasks", type=names, help=f"comma list of {', '.join(TASKS)}")
    parser.add_argument("-k", type=int, help=f"peers per round (default {FULL_K}; --quick {QUICK_K})")
    parser.add_argument("--fractions", type=lambda t: [float(x) for x in names(t)],
                        help=f"attacker fractions of k (default {','.join(map(str, FRACTIONS))})")
    parser.add_argument("--attacks", type=names, help=f"comma list of {', '.join(ATTACKS)}")
    parser.add_argument("--aggregators", type=names, help=f"comma list (default {','.join(AGGREGATORS)})")
    parser.add_argument("--relay-checks", choices=("on", "off"),
                        help="off: the relay's result checks that have a switch are off (outlier factor 0, "
                        "no host replays), so the aggregator alone meets the attacks")
    parser.add_argument("--honest-first", type=int,
                        help="attackers upload their first N results honestly (past the replay of first results)")
    parser.add_argument("--passes", type=int, help="passes over the units (default per task)")
    parser.add_argument("--aggregate-config", action="append", default=[], metavar="NAME=JSON",
                        help='settings for one aggregator, e.g. krum=\'{"f": 3}\' (repeat; default its own)')
    parser.add_argument("--lie-z", default="1.0", help="little_is_enough's z: a number or 'paper' (z_max for n, f)")
    parser.add_argument("--sybil-joins", type=int, default=10, help="extra joins from the sybil's one address")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes the peers' units train in (default: 2, or 1 on one core)")
    parser.add_argument("--seed", type=int, default=0, help="who attacks, the noise, the upload order")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--budget-s", type=float, default=1740.0, help="no new run starts after this many seconds")
    parser.add_argument("--replay-engine", choices=engines.ENGINE_CHOICES, default="auto",
                        help="the engine each relay replays on (its --replay-engine; auto: Pyodide under Node where it "
                        "runs). Where the relay refuses results of other engines (bytetext, CartPole on Pyodide), "
                        "the bench's peers train on it too, as pages do")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra argument for every relay (repeat)")
    parser.add_argument("--work-dir", type=Path, help="packages and sessions (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/attacks.json"), help="results as JSON")


# ---------------------------------------------------------------- the grid


CUSTOM = ("tasks", "fractions", "attacks", "aggregators", "relay_checks", "honest_first")


def sections_of(args: argparse.Namespace) -> tuple[list[Section], int]:
    """The sections to run and k: FULL or QUICK (those ``--sections`` names, with what the options name in
    place of theirs), or one section per task crossing what the options name (options left out take the
    grid's widest choice: every task, aggregator and attack, FRACTIONS; replay shares only where named)."""
    base, k = (QUICK, QUICK_K) if args.quick else (FULL, FULL_K)
    k = args.k or k
    verify_shares = getattr(args, "verify_shares", None)
    if getattr(args, "sections", None):
        return [narrowed(s, args) for s in picked(base, args.sections) if not args.tasks or s.task in args.tasks], k
    if all(getattr(args, name) is None for name in CUSTOM):
        return [dataclasses.replace(s, verify_shares=tuple(verify_shares)) if verify_shares and crosses(s)
                else s for s in base], k
    tasks = args.tasks or sorted({s.task for s in base})
    attacks = args.attacks or sorted({a for s in base for a in s.attacks}, key=ATTACKS.index)
    unknown = [a for a in attacks if a not in ATTACKS] + [t for t in tasks if t not in TASKS]
    if unknown:
        raise SystemExit(f"peertrain bench attacks: unknown task or attack {', '.join(unknown)}")
    aggregators = args.aggregators or sorted({a for s in base for a in s.aggregators}, key=AGGREGATORS.index)
    fractions = tuple(args.fractions) if args.fractions else (base[0].fractions if args.quick else FRACTIONS)
    checks, honest_first = args.relay_checks or "on", args.honest_first or 0
    title = (SHIPPED if checks == "on" else ALONE) + (f"; attackers honest on their first {honest_first} uploads"
                                                      if honest_first else "")
    if verify_shares and checks == "on":
        title += "; host replays at each share"
    return [Section(title, task, tuple(aggregators), tuple(attacks), tuple(f for f in fractions if f > 0), checks,
                    honest_first, verify_shares=tuple(verify_shares) if verify_shares and checks == "on" else None)
            for task in tasks], k


def crosses(section: Section) -> bool:
    """Whether ``--verify-shares`` replaces the section's shares (a section run as shipped keeps the relay's)."""
    return bool(section.verify_shares) and None not in (section.verify_shares or ())


def picked(base: tuple[Section, ...], wanted: list[str]) -> list[Section]:
    unknown = [name for name in wanted if name not in {s.name for s in base}]
    if unknown:
        raise SystemExit(f"peertrain bench attacks: no section {', '.join(unknown)} in this grid (it has "
                         f"{', '.join(s.name for s in base)})")
    return [s for s in base if s.name in wanted]


def narrowed(section: Section, args: argparse.Namespace) -> Section:
    """``section`` with what the options name in place of its own."""
    unknown = [a for a in args.attacks or () if a not in ATTACKS]
    if unknown:
        raise SystemExit(f"peertrain bench attacks: unknown attack {', '.join(unknown)}")
    changes: dict[str, Any] = {}
    for option, name in (("aggregators", "aggregators"), ("attacks", "attacks"), ("fractions", "fractions")):
        if getattr(args, option) is not None:
            changes[name] = tuple(getattr(args, option))
    if args.relay_checks is not None:
        changes["checks"] = args.relay_checks
    if args.honest_first is not None:
        changes["honest_first"] = args.honest_first
    if args.verify_shares and crosses(section):
        changes["verify_shares"] = tuple(args.verify_shares)
    return dataclasses.replace(section, **changes)


@dataclass(frozen=True)
class Planned:
    task: str
    aggregator: str
    checks: str
    attack: str
    fraction: float
    attackers: int
    honest_first: int
    verify: float | None = None  # host replay share (0: --no-verify); None: the relay's default

    @property
    def key(self) -> tuple[Any, ...]:
        """Runs with the same key are the same run (whichever fraction asked for that many attackers)."""
        return self.task, self.aggregator, self.checks, self.attack, self.attackers, self.honest_first, self.verify


def planned_runs(section: Section, k: int) -> list[Planned]:
    """Mean's honest run first (every comparison's anchor), then per aggregator its honest run, every attack
    at every fraction (round(f k) attackers, each count once), sybil once. A section that crosses replay
    shares: per aggregator, the honest run (where ``anchors``) and each attack, each at every share in turn
    (so that a budget that runs out leaves whole attacks, each with its share-0 anchor)."""
    def plan(aggregator: str, attack: str = "none", fraction: float = 0.0, attackers: int = 0,
             verify: float | None = None) -> Planned:
        first = section.honest_first if attack in UPLOAD_ATTACKS or attack == "sybil" else 0
        return Planned(section.task, aggregator, section.checks, attack, fraction, attackers, first, verify)

    if section.verify_shares is not None:
        crossed = []
        for aggregator in section.aggregators:
            for planned in ([plan(aggregator)] if section.anchors else []) + attacked(section, k, plan, aggregator):
                crossed += [dataclasses.replace(planned, verify=share) for share in section.verify_shares]
        return crossed
    runs = [plan("mean")]
    for aggregator in section.aggregators:
        if aggregator != "mean":
            runs.append(plan(aggregator))
        runs += attacked(section, k, plan, aggregator)
    return runs


def attacked(section: Section, k: int, plan: Any, aggregator: str) -> list[Planned]:
    """Every attack of ``section`` at every fraction (round(f k) attackers, each count once), sybil once."""
    runs = []
    for attack in section.attacks:
        if attack == "sybil":
            runs.append(plan(aggregator, attack))
            continue
        counts: set[int] = set()
        for fraction in section.fractions:
            attackers = round(fraction * k)
            if 0 < attackers <= k and attackers not in counts:
                counts.add(attackers)
                runs.append(plan(aggregator, attack, fraction, attackers))
    return runs


def supported(sections: list[Section], features: RelayFeatures, configs: dict[str, str]) -> list[Section]:
    """The sections with the aggregators this relay can run (all with --aggregate; else mean and default, both
    its plain FedAvg), and without ``default`` where the section also runs the aggregator it names with the
    same settings (``default centered_clipping with {}`` is ``--aggregate centered_clipping``)."""
    if not features.aggregate:
        dropped = sorted({a for s in sections for a in s.aggregators} - {"mean", "default"})
        if dropped:
            print(f"skipped: aggregators {', '.join(dropped)} (this relay's `peertrain serve` has no --aggregate)")
        return [dataclasses.replace(s, aggregators=tuple(a for a in s.aggregators if a in ("mean", "default")))
                for s in sections]
    same = features.default_aggregate if features.default_config == {} and \
        features.default_aggregate not in configs else None
    return [dataclasses.replace(s, aggregators=tuple(a for a in s.aggregators if a != "default"))
            if same in s.aggregators and "default" in s.aggregators else s for s in sections]


def aggregate_configs(values: list[str]) -> dict[str, str]:
    """``["krum={\"f\": 3}"]`` -> {"krum": '{"f": 3}'} (checked as JSON)."""
    configs = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep:
            raise SystemExit(f"peertrain bench attacks: --aggregate-config {value!r} is not NAME=JSON")
        json.loads(text)
        configs[name.strip()] = text
    return configs


def run(args: argparse.Namespace) -> int:
    features = relay_features()
    sections, k = sections_of(args)
    configs = aggregate_configs(args.aggregate_config)
    sections = supported(sections, features, configs)
    z = None if str(args.lie_z) == "paper" else float(args.lie_z)
    engine, fallback = engines.resolve(args.replay_engine) if "--replay-engine" in features.flags else ("native", None)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="peertrain-bench-attacks-"))
    work.mkdir(parents=True, exist_ok=True)
    for name in BLAS_THREADS:  # the relays and training processes started from here: one BLAS thread each, so
        os.environ.setdefault(name, "1")  # that they never spin against each other (see attack_training)
    started = time.perf_counter()
    records: list[RunRecord] = []
    done: dict[tuple[Any, ...], RunRecord] = {}
    shown: list[tuple[Section, list[RunRecord]]] = []
    skipped: list[str] = []
    packages: dict[str, Package] = {}
    trainers: dict[str, dict[str, Trainer]] = {}
    failures = 0
    print(f"relay: --aggregate {'yes' if features.aggregate else 'no'} (default "
          f"{features.default_aggregate or 'unknown'}), client addresses through a trusted proxy "
          f"{'yes' if features.proxied else 'no'}; replays on {engine}"
          f"{' (' + fallback + ')' if fallback else ''}; k={k}; "
          f"{sum(len(planned_runs(s, k)) for s in sections)} runs planned (some shared)", flush=True)
    try:
        for section in sections:
            grid = TASKS[section.task]
            passes = args.passes or (grid.quick_passes if args.quick else grid.passes)
            if section.task not in packages:
                packages[section.task] = build_package(grid.task, grid.settings, work / f"package-{section.task}",
                                                       seed=0, log=lambda _: None)
            rows: list[RunRecord] = []
            shown.append((section, rows))
            for planned in planned_runs(section, k):
                if planned.key in done:
                    rows.append(done[planned.key])
                    continue
                if time.perf_counter() - started > args.budget_s:
                    skipped.append(" ".join(map(str, planned.key)))
                    continue
                record = RunRecord(section=section.title, task=section.task, aggregator=planned.aggregator,
                                   checks=section.checks, attack=planned.attack, fraction=planned.fraction,
                                   attackers=planned.attackers, metric=grid.metric, honest_first=planned.honest_first,
                                   verify=planned.verify)
                spec = RunSpec(url="", attack=None if planned.attack == "none" else planned.attack,
                               attackers=planned.attackers, k=k, seed=args.seed, z=z, sybil_joins=args.sybil_joins,
                               timeout_s=args.run_timeout, honest_first=planned.honest_first, admin_token=ADMIN,
                               replay_engine=engine)
                serve = serve_command(packages[section.task].path, work / "session", k, passes, planned.aggregator,
                                      features, checks=section.checks, configs=configs, verify=planned.verify,
                                      replay_engine=engine, extra=args.serve_arg)
                one_run(record, spec, serve, work, trainers.setdefault(section.task, {}), args.jobs)
                done[planned.key] = record
                rows.append(record)
                records.append(record)
                compare(records, TASKS)
                print_progress(record)
                failures = failures + 1 if record.error else 0
                if failures >= MAX_FAILURES_IN_A_ROW:
                    log = (work / "serve.log").read_text()[-2000:] if (work / "serve.log").exists() else ""
                    raise SystemExit(f"peertrain bench attacks: {failures} runs in a row failed; the last: "
                                     f"{record.error}\nthe relay's log ends:\n{log}")
    finally:
        for kept in trainers.values():
            for trainer in kept.values():
                trainer.close()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - started
    text = tables(shown, TASKS, features)
    print()
    print(text)
    if skipped:
        print(f"budget of {args.budget_s:.0f} s spent: {len(skipped)} runs not run: {'; '.join(skipped)}")
    banned = sum(r.honest_banned or 0 for r in records)
    if banned:
        print(f"WARNING: {banned} honest peer(s) banned over {sum(1 for r in records if r.honest_banned)} runs "
              "(see the WARNING lines above): host replays judged an honest result a cheat", flush=True)
    print(f"{len(records)} runs in {total:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    index = {id(r): i for i, r in enumerate(records)}
    args.out.write_text(json.dumps({
        "k": k, "quick": bool(args.quick), "lie_z": args.lie_z, "sybil_joins": args.sybil_joins, "jobs": args.jobs,
        "sections": [{**asdict(s), "runs": [index[id(r)] for r in rows]} for s, rows in shown],
        "tasks": {name: asdict(TASKS[name]) for name in dict.fromkeys(s.task for s in sections)},
        "relay": {"aggregate": features.aggregate, "default_aggregate": features.default_aggregate,
                  "flags": sorted(features.flags)},
        "seconds": total, "skipped": skipped, "tables": text, "runs": [asdict(r) for r in records]}, indent=1))
    print(f"results: {args.out}")
    return 1 if any(r.error for r in records) else 0
