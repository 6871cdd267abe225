"""``peertrain bench merges --study``: FedAvg against the server optimizers, compared fairly.

One run on one seed with FedAvg at whatever client rate came first is how a server optimizer "wins": a
larger server step can stand in for a client rate FedAvg never tried, and a lucky seed can stand in for a
method. The protocol here removes both:

1. For each local training recipe (client SGD without momentum, as in Reddi et al. 2021; local Adam, as the
   bytetext task trains by default) FedAvg's client learning rate is tuned over a grid.
2. Every server optimizer runs over a small grid at the best client rate and at 1/3 and 1/10 of it; FedAvg
   also runs at those rates (so a method that needs a smaller client rate competes with FedAvg at that rate).
3. Settings are chosen on ``val_loss``, half of the validation windows (bytetext ``report_half``); what is
   reported is ``report_loss``, the other half, which no choice looked at.
4. FedAvg's best setting and the best server optimizer of each recipe (and, with ``rerun_controls``, the best
   bigger-step control: FedAvg with a server learning rate of 2; otherwise its seed-0 run is reported) run again
   on two more seeds (other initial weights and chunk orders, the same data); the table gives the mean and spread
   over the 3 seeds: the final report loss relative to the best FedAvg of all recipes, and the first round at which
   each reaches that FedAvg's report loss after round 31 (the report's "in 20 rounds instead of 31").

Sessions run as a sweep (``server.simulation.sweep``): a local process pool by default, or Ray with ``--ray``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.simulation.simulator import MergeChoice, fmt

TARGET_ROUND = 31
GOAL_ROUNDS = 20  # the report: the best settings got to FedAvg's round-31 loss in 20 rounds
GOAL_LOWER = 0.30  # ... and ended up to 38% lower; the goal under test: at least 30% lower


@dataclass(frozen=True)
class Recipe:
    """A local training recipe: bytetext settings besides the learning rate, and FedAvg's client-rate grid."""

    name: str
    settings: Mapping[str, Any]
    rates: tuple[float, ...]


RECIPES = (
    Recipe("client-sgd", {"optimizer": "sgd", "momentum": 0.0}, (0.3, 1.0, 3.0)),
    Recipe("local-adam", {"optimizer": "adam"}, (1e-3, 3e-3, 1e-2)),
)
FEDAVG = MergeChoice("fedavg")
SERVER_GRID = (
    MergeChoice("fedavg", {"server_learning_rate": 2.0}),  # the control: only a bigger step
    MergeChoice("fedavgm", {"server_momentum": 0.9}),
    MergeChoice("fedadam", {"eta": 1e-2}),
    MergeChoice("fedyogi", {"eta": 1e-2}),
    MergeChoice("fedadagrad", {"eta": 1e-2}),
)
RATE_FACTORS = (1.0, 1 / 3, 1 / 10)
MAX_EXTENSIONS = 2  # FedAvg rates past the grid's edge, per recipe


def neighbour(rate: float, *, up: bool) -> float:
    """The next rate on the half-decade ladder (..., 0.1, 0.3, 1, 3, ...) above or below ``rate``."""
    exponent = math.floor(math.log10(rate) + 1e-9)
    mantissa = 3 if rate / 10.0**exponent > 2 else 1
    if up:
        mantissa, exponent = (3, exponent) if mantissa == 1 else (1, exponent + 1)
    else:
        mantissa, exponent = (1, exponent) if mantissa == 3 else (3, exponent - 1)
    return float(f"{mantissa * 10.0**exponent:.2g}")


SEEDS = (0, 1, 2)
TOP_SERVER_SETTINGS = 1  # per recipe, rerun over every seed besides FedAvg's best


@dataclass(frozen=True)
class Run:
    """One session of the study: a recipe at a client rate, a server setting, a seed."""

    recipe: str
    lr: float
    merge: str
    config: tuple[tuple[str, Any], ...] = ()  # the merge's settings (hashable: runs key the results)
    seed: int = 0

    @classmethod
    def of(cls, recipe: str, lr: float, choice: MergeChoice, seed: int = 0) -> Run:
        return cls(recipe, lr, choice.name, tuple(choice.config.items()), seed)

    @property
    def choice(self) -> MergeChoice:
        return MergeChoice(self.merge, dict(self.config))

    def with_seed(self, seed: int) -> Run:
        return Run(self.recipe, self.lr, self.merge, self.config, seed)

    @property
    def setting(self) -> str:
        return f"{self.recipe} lr={self.lr:g} {self.choice.label}"

    @property
    def label(self) -> str:
        return f"{self.setting} seed={self.seed}"

    @property
    def is_fedavg(self) -> bool:
        """Plain FedAvg (server learning rate 1): the anchor."""
        return self.choice == FEDAVG

    @property
    def is_server_optimizer(self) -> bool:
        """A method the claim is about (FedAvgM and the adaptive ones), not FedAvg or its bigger-step control."""
        return self.merge != "fedavg"

    def slug(self) -> str:
        return f"{self.recipe}_lr{self.lr:g}_{self.choice.slug}_s{self.seed}"


@dataclass
class Series:
    """A finished session's loss after r rounds (r = 0: the initial model) on both validation halves."""

    val: list[float | None]
    report: list[float | None]
    events: list[str] = field(default_factory=list)

    @property
    def final_val(self) -> float:
        value = self.val[-1]
        return math.inf if value is None or not math.isfinite(value) else value

    def final_report(self) -> float:
        value = self.report[-1]
        return math.inf if value is None or not math.isfinite(value) else value


def first_round_reaching(values: Sequence[float | None], target: float) -> int | None:
    """The first r >= 1 with values[r] <= target, or None."""
    for rounds_done, value in enumerate(values[1:], start=1):
        if value is not None and math.isfinite(value) and value <= target:
            return rounds_done
    return None


def rate_for(rates: Sequence[float], value: float) -> float:
    """``value`` as the grid writes it: the grid's half-decade steps (x 3.16) stand for "1/3" (1/3 of 1 is the
    grid's 0.3), and 1/10 of 0.3 is 0.03, not 0.030000000000000002."""
    for rate in rates:
        if math.isclose(rate, value, rel_tol=0.12):
            return rate
    return float(f"{value:.2g}")


@dataclass
class StudyPlan:
    """What the study runs, stage by stage; ``best_rate`` fills in after stage 1."""

    recipes: Sequence[Recipe] = RECIPES
    grid: Sequence[MergeChoice] = SERVER_GRID
    seeds: Sequence[int] = SEEDS
    top: int = TOP_SERVER_SETTINGS
    rerun_controls: bool = False  # rerun the best bigger-step control on every seed too (else: seed 0 only)
    results: dict[Run, Series] = field(default_factory=dict)

    def stage1(self) -> list[Run]:
        return [Run.of(r.name, lr, FEDAVG) for r in self.recipes for lr in r.rates]

    def extension(self, recipe: Recipe) -> Run | None:
        """FedAvg one half-decade past the grid's edge when its best rate sits on that edge (a rate is tuned only
        when both neighbours were tried), at most ``MAX_EXTENSIONS`` times per recipe; None: tuned."""
        tried = sorted(run.lr for run in self.results if run.recipe == recipe.name and run.is_fedavg and run.seed == 0)
        best = self.best_rate(recipe)
        if len(tried) - len(recipe.rates) >= MAX_EXTENSIONS or best not in (tried[0], tried[-1]):
            return None
        return Run.of(recipe.name, neighbour(best, up=best == tried[-1]), FEDAVG)

    def best_rate(self, recipe: Recipe) -> float:
        tried = [run for run in self.results if run.recipe == recipe.name and run.is_fedavg and run.seed == 0]
        return min(tried, key=lambda run: (self.results[run].final_val, run.lr)).lr

    def rates_around(self, recipe: Recipe) -> list[float]:
        best = self.best_rate(recipe)
        tried = sorted({run.lr for run in self.results if run.recipe == recipe.name and run.is_fedavg})
        return [rate_for(tried or recipe.rates, best * factor) for factor in RATE_FACTORS]

    def stage2(self) -> list[Run]:
        runs = []
        for recipe in self.recipes:
            for lr in self.rates_around(recipe):
                runs += [Run.of(recipe.name, lr, choice) for choice in (FEDAVG, *self.grid)]
        return [run for run in runs if run not in self.results]

    def chosen(self, recipe: Recipe) -> list[Run]:
        """FedAvg's best seed-0 run of ``recipe`` and its ``top`` best server-optimizer runs, by val_loss."""
        seed0 = [run for run in self.results if run.recipe == recipe.name and run.seed == 0]
        by_val = sorted(seed0, key=lambda run: (self.results[run].final_val, run.label))
        fedavg = next(run for run in by_val if run.is_fedavg)
        control = self.best_control(recipe) if self.rerun_controls else None
        return [fedavg, *([control] if control else []), *[run for run in by_val if run.is_server_optimizer][:self.top]]

    def best_control(self, recipe: Recipe) -> Run | None:
        """The best seed-0 run of the bigger-step control (FedAvg with another server rate), by val_loss."""
        controls = [run for run in self.results if run.recipe == recipe.name and run.seed == 0
                    and run.merge == "fedavg" and not run.is_fedavg]
        return min(controls, key=lambda run: (self.results[run].final_val, run.label), default=None)

    def stage3(self) -> list[Run]:
        return [run.with_seed(seed) for recipe in self.recipes for run in self.chosen(recipe)
                for seed in self.seeds if seed != 0]

    def planned_sessions(self) -> int:
        """How many sessions the study runs at most (stage 2 may find some already run in stage 1)."""
        per_recipe = len(RATE_FACTORS) * (1 + len(self.grid))
        controls = 1 if self.rerun_controls and any(choice.name == "fedavg" for choice in self.grid) else 0
        return sum(len(r.rates) + MAX_EXTENSIONS + per_recipe for r in self.recipes) + \
            len(self.recipes) * (1 + controls + self.top) * (len(self.seeds) - 1)


@dataclass
class Verdict:
    table: str
    verdict: str
    rows: list[dict[str, Any]]
    anchor: str
    plot_series: dict[str, list[float | None]]


def mean_series(series: Sequence[Series]) -> list[float | None]:
    out: list[float | None] = []
    for values in zip(*(s.report for s in series), strict=False):
        finite = [v for v in values if v is not None and math.isfinite(v)]
        out.append(statistics.fmean(finite) if len(finite) == len(values) else None)
    return out


def spread(values: Sequence[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < len(values):
        return f"{len(values) - len(finite)} of {len(values)} diverged"
    return f"{statistics.fmean(finite):.4f} ± {statistics.stdev(finite) if len(finite) > 1 else 0.0:.4f}"


def judge(plan: StudyPlan, target_round: int = TARGET_ROUND) -> Verdict:
    """The final table over every seed: each chosen setting against the best FedAvg of all recipes."""
    settings: dict[str, list[Run]] = {}
    for recipe in plan.recipes:
        for run in plan.chosen(recipe):
            settings[run.setting] = [run.with_seed(seed) for seed in plan.seeds]
    groups = {name: [plan.results[run] for run in runs if run in plan.results] for name, runs in settings.items()}
    fedavg_names = [name for name, runs in settings.items() if runs[0].is_fedavg]
    anchor = min(fedavg_names, key=lambda name: statistics.fmean(s.final_report() for s in groups[name]))
    anchor_mean = mean_series(groups[anchor])
    target_round = min(target_round, len(anchor_mean) - 1)
    target = anchor_mean[target_round]
    anchor_final = statistics.fmean(s.final_report() for s in groups[anchor])
    lines = [f"| setting | seeds | final report_loss (mean ± sd) | vs best FedAvg ({anchor}) | "
             f"rounds to its round-{target_round} loss ({fmt(target)}), per seed |",
             "| --- | ---: | ---: | ---: | --- |"]
    rows: list[dict[str, Any]] = []
    for name, series in groups.items():
        finals = [s.final_report() for s in series]
        mean_final = statistics.fmean(finals) if all(math.isfinite(f) for f in finals) else math.inf
        reached = [first_round_reaching(s.report, target) if target is not None else None for s in series]
        relative = mean_final / anchor_final - 1 if math.isfinite(mean_final) else math.inf
        rows.append({"setting": name, "seeds": len(series), "finals": finals, "relative": relative,
                     "reached": reached})
        shown = ", ".join("never" if r is None else str(r) for r in reached)
        lines.append(f"| {name} | {len(series)} | {spread(finals)} | {relative:+.1%} | {shown} |")
    server_rows = [row for row in rows if settings[row["setting"]][0].is_server_optimizer]
    best = min(server_rows, key=lambda row: row["relative"])
    controls = [row for row in rows if settings[row["setting"]][0].merge == "fedavg"
                and not settings[row["setting"]][0].is_fedavg]
    reached_all = [r for r in best["reached"] if r is not None]
    mean_reached = statistics.fmean(reached_all) if len(reached_all) == len(best["reached"]) else None
    holds = mean_reached is not None and mean_reached <= GOAL_ROUNDS and best["relative"] <= -GOAL_LOWER
    verdict = (f"Best server optimizer: {best['setting']}: final report_loss {best['relative']:+.1%} against the best "
               f"FedAvg ({anchor}), reaching its round-{target_round} loss in "
               f"{'never (in some seed)' if mean_reached is None else f'{mean_reached:.1f} rounds'} (mean of "
               f"{len(best['reached'])} seeds). The report's claim (within {GOAL_ROUNDS} rounds and at least "
               f"{GOAL_LOWER:.0%} lower) {'holds' if holds else 'does not hold'} under this protocol.")
    for recipe in plan.recipes if not controls else ():  # not rerun: the control's seed-0 run, said so
        control = plan.best_control(recipe)
        if control is not None:
            run_series = plan.results[control]
            control_reached = first_round_reaching(run_series.report, target) if target is not None else None
            controls.append({"setting": f"{control.setting} (seed 0 only)",
                             "relative": run_series.final_report() / anchor_final - 1, "reached": [control_reached]})
    for row in controls:
        verdict += (f" The bigger-step control {row['setting']} ends {row['relative']:+.1%} (reaching it in "
                    f"{', '.join('never' if r is None else str(r) for r in row['reached'])} rounds).")
    plot_series = {name: mean_series(series) for name, series in groups.items()}
    return Verdict("\n".join(lines), verdict, rows, anchor, plot_series)


def stage_table(plan: StudyPlan) -> str:
    """Every seed-0 session: the tuning loss it was chosen on and the report loss beside it."""
    lines = ["| recipe | client lr | server setting | final val_loss (tuning) | final report_loss | events |",
             "| --- | ---: | --- | ---: | ---: | --- |"]
    for run in sorted((r for r in plan.results if r.seed == 0), key=lambda r: (r.recipe, -r.lr, r.choice.label)):
        series = plan.results[run]
        lines.append(f"| {run.recipe} | {run.lr:g} | {run.choice.label} | {fmt(series.final_val)} | "
                     f"{fmt(series.final_report())} | {'; '.join(series.events) or '-'} |")
    return "\n".join(lines)


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--study", action="store_true",
                        help="the fair protocol: tune FedAvg's client rate per local recipe, grid every server "
                             "optimizer at 1, 1/3 and 1/10 of it, choose on half the validation windows, report "
                             "on the other half over 3 seeds (48 sessions, about 80 min on 2 cores)")
    parser.add_argument("--study-seeds", type=int, default=len(SEEDS),
                        help=f"seeds of the final reruns, 0..N-1 (default {len(SEEDS)})")
    parser.add_argument("--study-fresh", action="store_true",
                        help="run every session again (by default a study started again reuses the sessions an "
                             "earlier run finished with the same package and settings)")


def record(plan: StudyPlan, runs: Sequence[Run], histories: Sequence[Sequence[Mapping[str, Any]]],
           initials: Sequence[Mapping[str, Any]]) -> None:
    """Store finished sessions' series in the plan (history entries' metrics after the initial ones)."""
    for run, history, initial in zip(runs, histories, initials, strict=True):
        val = [initial.get("val_loss")] + [entry["metrics"].get("val_loss") for entry in history]
        report = [initial.get("report_loss")] + [entry["metrics"].get("report_loss") for entry in history]
        events = [f"round {e['round'] + 1}: {ev['type']}" for e in history for ev in e.get("events", [])]
        plan.results[run] = Series(val, report, events)


def write_report(plan: StudyPlan, verdict: Verdict, out: Path, *, command: str, seconds: float,
                 steps: int) -> str:
    from server.session.plot import plot_metric

    plot = plot_metric(verdict.plot_series, out / "study.png", metric="report_loss (mean of seeds)",
                       title=f"bytelm-2.3mb, 55 chunks, k=5, {steps} local steps: chosen settings, mean of "
                             f"{len(plan.seeds)} seeds")
    text = (f"## Chosen settings over {len(plan.seeds)} seeds\n\n{verdict.table}\n\n{verdict.verdict}\n\n"
            f"## Every seed-0 session (stages 1 and 2)\n\n{stage_table(plan)}\n\n"
            f"Command: `{command}`; {len(plan.results)} sessions in {seconds / 60:.1f} min. Plot: {plot}\n")
    (out / "study.md").write_text(text)
    (out / "study.json").write_text(json.dumps({
        "runs": [{"recipe": r.recipe, "lr": r.lr, "merge": r.merge, "merge_config": dict(r.config),
                  "seed": r.seed, "val_loss": s.val, "report_loss": s.report, "events": s.events}
                 for r, s in plan.results.items()],
        "verdict": verdict.verdict, "anchor": verdict.anchor, "rows": verdict.rows}, indent=1, default=str) + "\n")
    return text


def elapsed(started: float) -> float:
    return time.perf_counter() - started


def finished(directory: Path, spec: Any) -> Any:
    """The session an earlier run of the study finished in ``directory`` with ``spec``'s package and config, or
    None (absent, unfinished, or another config: it runs again)."""
    from server.session.session import Session

    if not (directory / "session.json").is_file():
        return None
    try:
        session = Session.restore(directory, spec.package)
    except Exception:  # (a folder the study cannot read back is simply run again)
        return None
    return session if session.done and session.config == spec.config else None


def run_study(args: argparse.Namespace, sweep: Mapping[str, Any]) -> int:
    """The whole protocol (``args``: ``peertrain bench merges``'s options; ``sweep``: ``sweep_settings``)."""
    from server.session.config import SessionConfig
    from server.session.package import Package, build_package
    from server.simulation.sweep import SessionSpec, describe_engine, run_sessions

    started = time.perf_counter()
    out: Path = args.out / "study"
    plan = StudyPlan(seeds=tuple(range(args.study_seeds)))
    packages: dict[tuple[str, float, int], Package] = {}
    recipes = {recipe.name: recipe for recipe in plan.recipes}
    engine = {"engine": sweep["engine"], "workers": sweep["workers"], "address": sweep["ray_address"]}
    print(f"study: at most {plan.planned_sessions()} sessions of {args.rounds or 33} rounds, "
          f"{describe_engine(engine['engine'], engine['workers'], engine['address'], plan.planned_sessions())}")

    def package_for(run: Run) -> Package:
        key = (run.recipe, run.lr, run.seed)
        if key not in packages:
            settings = {"chunks": 55, "steps": args.steps, "validation_windows": args.validation_windows,
                        "report_half": True, "lr": run.lr, **recipes[run.recipe].settings}
            folder = out / "packages" / f"{run.recipe}_lr{run.lr:g}_s{run.seed}"
            packages[key] = build_package("bytetext", settings, folder, seed=run.seed, log=lambda _: None)
        return packages[key]

    def execute(stage: str, runs: Sequence[Run]) -> None:
        if not runs:
            return
        print(f"{stage}: {len(runs)} sessions")
        specs = [SessionSpec(package_for(run), SessionConfig(
            merge=run.merge, merge_config=dict(run.config), participants=5, passes=3, seed=run.seed,
            max_rounds=args.rounds, aggregate="mean", label=run.label,
            codec="none"), run.slug()) for run in runs]  # (the study compares merges on float32 results)
        done = {} if args.study_fresh else {spec.name: h for spec in specs
                                            if (h := finished(out / "sessions" / spec.name, spec)) is not None}
        if done:
            print(f"  {len(done)} of them finished in an earlier run of the study: reused")
        todo = [(run, spec) for run, spec in zip(runs, specs, strict=True) if spec.name not in done]
        outcomes = run_sessions([spec for _, spec in todo], engine=engine["engine"], workers=engine["workers"],
                                address=engine["address"], progress=args.progress, out=out / "sessions") \
            if todo else []
        sessions = done | {spec.name: outcome.session for (_, spec), outcome in zip(todo, outcomes, strict=True)}
        # (the initial metrics are the sessions' own: each validated its initial weights when it was created)
        record(plan, runs, [sessions[spec.name].history for spec in specs],
               [sessions[spec.name].initial_metrics for spec in specs])

    execute("stage 1 (FedAvg's client rate per recipe)", plan.stage1())
    while extensions := [run for run in (plan.extension(recipe) for recipe in plan.recipes) if run is not None]:
        execute("stage 1, past the grid's edge (the best rate was on it)", extensions)
    for recipe in plan.recipes:
        print(f"  {recipe.name}: best FedAvg client lr {plan.best_rate(recipe):g}; server optimizers at "
              f"{', '.join(f'{lr:g}' for lr in plan.rates_around(recipe))}")
    execute("stage 2 (every server setting at 1, 1/3 and 1/10 of that rate)", plan.stage2())
    for recipe in plan.recipes:
        print(f"  {recipe.name}: chosen on val_loss: {'; '.join(run.setting for run in plan.chosen(recipe))}")
    execute(f"stage 3 (the chosen settings on seeds 1..{len(plan.seeds) - 1})", plan.stage3())
    verdict = judge(plan)
    command = (f"peertrain bench merges --study --steps {args.steps} --validation-windows {args.validation_windows}"
               + (f" --rounds {args.rounds}" if args.rounds else "") + (f" --study-seeds {args.study_seeds}"
                                                                       if args.study_seeds != len(SEEDS) else ""))
    text = write_report(plan, verdict, out, command=command, seconds=elapsed(started), steps=args.steps)
    if args.copy_plot is not None:
        import shutil

        args.copy_plot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "study.png", args.copy_plot)
    print(text)
    return 0
