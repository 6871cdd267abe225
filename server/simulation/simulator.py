"""The simulator: whole sessions in-process, with the same runtime code a browser runs.

Each unit is computed by ``task.train_unit(global_weights, unit)``, exactly what a peer's worker
calls, and fed to a :class:`server.session.Session`. Several merge methods (or several settings of
one) run from the same package, so they share the initial weights and the chunk order; one plot and
one table compare them. The sessions run one after another in-process, or in parallel on a local
process pool or on Ray (``server.simulation.sweep``), with the same results bit for bit.

A merge choice is ``NAME`` or ``NAME:key=value,key=value`` (e.g. ``fedavgm:server_momentum=0.5``);
options such as ``--server-momentum`` fill in whatever a choice leaves unset.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.merge import InvalidHyperparameter, merge_class
from runtime.planner import RoundPlan, check_merge_guard
from server.session.metrics import RoundLog
from server.session.package import Package
from server.session.plot import plot_metric
from server.session.session import Session, SessionConfig
from server.simulation.sweep import Engine, SessionSpec, describe_engine, run_sessions
from server.simulation.sweep_worker import run_round as run_round  # (its home was here; tests import it from here)

# Short names for labels and folder names.
SHORT_NAMES = {"server_learning_rate": "lr", "server_momentum": "m", "nesterov": "nesterov", "eta": "eta",
               "beta_1": "b1", "beta_2": "b2", "tau": "tau", "bias_correction": "bc"}


@dataclass(frozen=True)
class MergeChoice:
    """One merge method with its hyperparameters, as compared by the simulator."""

    name: str
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.config:
            return self.name
        return self.name + " " + " ".join(f"{SHORT_NAMES.get(k, k)}={v}" for k, v in self.config.items())

    @property
    def slug(self) -> str:
        """A folder name: the label without spaces or odd characters."""
        return re.sub(r"[^A-Za-z0-9.=_-]+", "_", self.label.replace(" ", "-")).replace("=", "")


def parse_merge_choices(values: Sequence[str]) -> list[MergeChoice]:
    """``["fedavg,fedavgm:server_momentum=0.5,server_learning_rate=0.5", "fedadam"]`` -> three choices.

    A comma-separated piece with ``=`` but no ``:`` continues the previous choice's settings.
    """
    pieces: list[list[str]] = []
    for value in values:
        for piece in (p.strip() for p in value.split(",")):
            if not piece:
                continue
            if "=" in piece and ":" not in piece:
                if not pieces:
                    raise InvalidHyperparameter(f"merge setting {piece!r} comes before any method name")
                pieces[-1].append(piece)
            else:
                pieces.append([piece])
    choices = []
    for name_part, *more in pieces:
        name, _, first = name_part.partition(":")
        config: dict[str, Any] = {}
        for setting in ([first] if first else []) + more:
            key, sep, raw = setting.partition("=")
            if not sep:
                raise InvalidHyperparameter(f"merge setting {setting!r} is not key=value")
            try:
                config[key.strip()] = json.loads(raw)
            except json.JSONDecodeError:
                raise InvalidHyperparameter(f"merge setting {setting!r}: {raw!r} is not a number or true/false") \
                    from None
        merge_class(name.strip()).from_config(config)  # unknown names and settings fail here, before any work
        choices.append(MergeChoice(name.strip(), config))
    return choices or [MergeChoice("fedavg")]


def with_common_settings(choices: Sequence[MergeChoice], common: Mapping[str, Any]) -> list[MergeChoice]:
    """Fill each choice's unset hyperparameters from ``common`` where the method takes them.

    A common setting that none of the chosen methods takes is an error (a typo should not pass silently).
    """
    unused = set(common)
    out = []
    for choice in choices:
        accepted = merge_class(choice.name)().to_config()
        extra = {k: v for k, v in common.items() if k in accepted and k not in choice.config}
        unused -= {k for k in common if k in accepted}
        out.append(MergeChoice(choice.name, {**choice.config, **extra}))
    if unused:
        names = ", ".join(sorted(unused))
        raise InvalidHyperparameter(f"no chosen merge method takes {names} (chosen: "
                                    f"{', '.join(sorted({c.name for c in choices}))})")
    return out


def choice_config(config: SessionConfig, choice: MergeChoice) -> SessionConfig:
    """``config`` with ``choice``'s merge method, its settings and its label: one session of a comparison."""
    return dataclasses.replace(config, merge=choice.name, merge_config=dict(choice.config), label=choice.label)


@dataclass
class Comparison:
    """The sessions of one simulator call, in the order they ran, and where their outputs went."""

    sessions: list[Session]
    out: Path
    plot: Path
    table: str
    seconds: float


def compare(package: Package, choices: Sequence[MergeChoice], config: SessionConfig, *, out: Path,
            progress: bool = True, title: str = "", log: Callable[[str], Any] = print, engine: Engine = "local",
            workers: int | None = None, ray_address: str | None = None,
            round_log: RoundLog | None = None) -> Comparison:
    """Run one session per merge choice (same package, same plan), then write the plot and the table. Each session
    is ``config`` with the choice's merge, merge settings and label (``choice_config``).

    ``engine``, ``workers``, ``ray_address``: where the sessions run (``server.simulation.sweep.run_sessions``:
    in-process one after another, a local process pool, or Ray); the results are the same bits on each (not with
    differential privacy, the config's ``dp_*`` settings: each session draws its noise from its own secret).
    ``round_log``: where every session's rounds go besides its history (``server.session.metrics``)."""
    out = Path(out)
    plan = RoundPlan(package.data.num_units, config.participants, config.passes, config.seed)
    for choice in choices:  # refuse before training anything
        check_merge_guard(choice.name, plan, force=config.force)
    configs = [choice_config(config, choice) for choice in choices]
    started = time.perf_counter()
    specs = [SessionSpec(package, config, choice.slug) for choice, config in zip(choices, configs, strict=True)]
    outcomes = run_sessions(specs, engine=engine, workers=workers, address=ray_address, progress=progress, out=out,
                            round_log=round_log)
    sessions = [outcome.session for outcome in outcomes if outcome.session is not None]
    seconds = time.perf_counter() - started
    task = package.task
    plot = plot_metric({s.config.name: s.metric_series() for s in sessions}, out / "comparison.png",
                       metric=task.metric, title=title or f"{task.name}: {task.metric} per round",
                       events={s.config.name: [e["round"] + 1 for e in s.history if e["events"]] for s in sessions})
    table = comparison_table(sessions)
    (out / "comparison.md").write_text(table + "\n")
    (out / "summary.json").write_text(json.dumps([s.describe() for s in sessions], indent=2) + "\n")
    log(table)
    where = describe_engine(engine, workers, ray_address, len(sessions))
    log(f"{len(sessions)} session(s) in {seconds:.1f} s {where}; plot {plot}; histories {out}/*/history.jsonl")
    return Comparison(sessions=sessions, out=out, plot=plot, table=table, seconds=seconds)


def fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def comparison_table(sessions: Sequence[Session]) -> str:
    """A Markdown table: final and best metric per session, and the final relative to the first session's."""
    metric = sessions[0].metric
    anchor = sessions[0].metric_series()[-1]
    lines = [f"| merge | rounds | final {metric} | best {metric} (after round) | final / {sessions[0].config.name} "
             "| events |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for session in sessions:
        final = session.metric_series()[-1]
        ratio = final / anchor if final is not None and anchor else None
        best_after = "initial" if session.best_round is None else str(session.best_round + 1)
        events = "; ".join(f"round {e['round'] + 1}: {ev['type']} ({ev['action']})"
                           for e in session.history for ev in e["events"]) or "-"
        lines.append(f"| {session.config.name} | {session.round} | {fmt(final)} | {fmt(session.best_metric)} "
                     f"({best_after}) | {fmt(ratio, 3)} | {events} |")
    return "\n".join(lines)
