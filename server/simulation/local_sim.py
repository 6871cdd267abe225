"""Simulated peers of a local task, each with a folder of its own files (``peertrain simulate --local-data``).

A local task's units train on the files a peer chose (``runtime.tasks.local``). Here every simulated peer is
``runtime.tasks.local.LocalData`` over one folder, read the way a page reads what its person chose: each file's
bytes under its path relative to the folder, parsed by the task's ``parse_local``, split once into training and
the seeded held-out share. Slot s of round r is trained by peer ``(r * k + s) mod P`` (P peers, k slots a round),
so with P = k every peer trains one unit a round; ``assign`` replaces that rule (a test maps each slot to the page
that trained it in a browser session, to replay the session natively). A unit is ``train_local_unit``, exactly
what a browser's worker runs, so the same files, weights and seed give the same result.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.planner import Assignment
from runtime.tasks import Task, TaskError, UnitResult
from runtime.tasks.local import LocalData, train_local_unit
from server.session.local_files import folder_files, peer_folders
from server.session.metrics import RoundLog
from server.session.package import Package
from server.session.plot import plot_metric
from server.session.session import Session, SessionConfig
from server.simulation.simulator import MergeChoice, choice_config
from server.simulation.uploads import SimulatedUploads


@dataclass
class LocalPeers:
    """The simulated peers of a local task: one ``LocalData`` per folder, ready to train."""

    task: Task
    folders: list[Path]
    data: list[LocalData]

    @classmethod
    def load(cls, task: Task, folders: Sequence[Path]) -> LocalPeers:
        """Every folder's files parsed; a folder without enough valid examples is an error naming its files'."""
        data = []
        for folder in folders:
            local = LocalData(task)
            for name, content in folder_files(folder):
                local.add(name, content)
            if not local.ready():
                problems = "; ".join(f.error for f in local.files if f.error) or "no files"
                raise TaskError(f"--local-data {folder}: no usable data for {task.name} ({problems})")
            data.append(local)
        if not data:
            raise TaskError("--local-data: no peer folders")
        return cls(task, list(folders), data)

    def describe(self) -> list[str]:
        """A line per peer: its folder, files, examples and how they split (refused files with the reason)."""
        lines = []
        for number, (folder, local) in enumerate(zip(self.folders, self.data, strict=True), start=1):
            summary = local.summary()
            refused = [f["error"] for f in summary["files"] if f["error"]]
            lines.append(f"peer {number} ({folder}): {summary['valid_files']} file(s), {summary['examples']} examples "
                         f"({summary['train']} train, {summary['held_out']} held out)"
                         + (f"; refused: {'; '.join(refused)}" if refused else ""))
        return lines

    def default_peer(self, assignment: Assignment, k: int) -> int:
        return (assignment.round * k + assignment.slot) % len(self.data)

    def train(self, session: Session, assignment: Assignment, peer: int) -> UnitResult:
        """The unit ``assignment`` trained by peer ``peer`` from the session's weights (a browser's computation)."""
        unit = self.data[peer].work_unit(assignment.unit_index, assignment.unit_seed,
                                         assignment.round / session.num_rounds)
        return train_local_unit(session.task, session.weights, unit)


def run_local_session(package: Package, config: SessionConfig, peers: LocalPeers, *, directory: Path | None = None,
                      assign: Callable[[Assignment], int] | None = None,
                      on_round: Callable[[dict[str, Any]], Any] | None = None,
                      round_log: RoundLog | None = None) -> Session:
    """One whole session of ``package``'s local task, every unit trained by the simulated peer ``assign`` names
    (default: the module docstring's rule); ``round_log``: where its rounds go besides the history."""
    session = Session.create(package, config, directory=directory, round_log=round_log)
    k = session.plan.participants_per_round
    uploads = SimulatedUploads()
    while not session.done:
        started = time.perf_counter()
        chosen = [(a, assign(a) if assign else peers.default_peer(a, k)) for a in session.assignments()]
        results = [(a, uploads.arrived(session, a, peers.train(session, a, peer), peer)) for a, peer in chosen]
        entry = session.complete_round(results, train_seconds=time.perf_counter() - started,
                                       contributors={a.slot: str(peer) for a, peer in chosen})
        if on_round is not None:
            on_round(entry)
    return session


def judged_value(session: Session, entry: Mapping[str, Any]) -> Any:
    """The session's metric in a round's entry: the host's validation, else the federated one."""
    if session.host_validates:
        return entry["metrics"].get(session.metric)
    return (entry.get("federated") or {}).get("metrics", {}).get(session.metric)


def simulate_local(package: Package, choices: Sequence[MergeChoice], folders: Sequence[Path], config: SessionConfig,
                   *, out: Path, progress: bool = True, log: Callable[[str], Any] = print,
                   round_log: RoundLog | None = None) -> list[Session]:
    """``peertrain simulate --local-data``: one session per merge choice on the same peers' files, one after
    another, each ``config`` with the choice's merge (``choice_config``); a line per round, then the plot and a
    table in ``out``."""
    out = Path(out)
    peers = LocalPeers.load(package.task, peer_folders(folders))
    for line in peers.describe():
        log(line)
    sessions = []
    for choice in choices:
        chosen = choice_config(config, choice)

        def report(entry: dict[str, Any], label: str = choice.label) -> None:
            federated = entry.get("federated") or {}
            shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(entry["metrics"].items()))
            fed = ", ".join(f"{k} {v:.4g}" for k, v in sorted(federated.get("metrics", {}).items()))
            if progress:
                log(f"{label} round {entry['round'] + 1}: host {shown or '-'}; federated (weights after "
                    f"{federated.get('of_round', '-')} rounds, {federated.get('examples', 0)} held-out examples) "
                    f"{fed or '-'}" + (f"; epsilon {entry['privacy']['epsilon']:.3g}" if "privacy" in entry else ""))

        started = time.perf_counter()
        session = run_local_session(package, chosen, peers, directory=out / choice.slug, on_round=report,
                                    round_log=round_log)
        log(f"{choice.label}: {session.round} rounds in {time.perf_counter() - started:.1f} s; judged by "
            f"{'the host' if session.host_validates else 'federated evaluation'}: best {session.metric} "
            f"{session.best_metric if session.best_metric is not None else '-'} "
            f"(after {'the initial weights' if session.best_round is None else f'round {session.best_round + 1}'})"
            + (f"; epsilon {session.privacy.epsilon:.3g} at delta {config.dp_delta:g}" if session.privacy else "")
            + (f"; stopped: {session.stopped}" if session.stopped else ""))
        sessions.append(session)
    task = package.task
    plot = plot_metric({s.config.name: s.metric_series() for s in sessions}, out / "comparison.png",
                       metric=task.metric, title=f"{task.name} (local data): {task.metric} per round",
                       events={s.config.name: [e["round"] + 1 for e in s.history if e["events"]] for s in sessions})
    (out / "summary.json").write_text(json.dumps([s.describe() for s in sessions], indent=2) + "\n")
    log(f"{len(sessions)} session(s); plot {plot}; histories {out}/*/history.jsonl")
    return sessions
