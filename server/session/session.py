"""A training session's round loop, independent of how units get computed.

The simulator computes each round's units in-process; the relay will hand them to browsers and feed
back what arrives over HTTP. Both drive the same object::

    session = Session.create(package, SessionConfig(merge="fedavgm", participants=5, passes=3), directory=out)
    while not session.done:
        assignments = session.assignments()
        results = [(a, task.train_unit(session.weights, session.work_unit(a))) for a in assignments]
        session.complete_round(results)     # merge, validate, divergence watch, history, checkpoint

A session owns the package (task, data, fingerprint), the round plan (C units, k participants, E passes,
seed), the merge method and its server state, the global weights, the round counter, the history and
the best weights so far. Stateful merges are refused at the start when a round covers a large share of
the data (``runtime.planner.check_merge_guard``) unless ``force`` is set. After every merge the model
is validated; a non-finite metric, or a lower-is-better metric past ``divergence_factor`` times the
best so far, is a divergence: ``stop`` ends the session, ``rollback`` restores the best weights and
resets the merge method's state. Either way the history records it as an event.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from runtime.aggregate import Aggregator, make_aggregator
from runtime.aggregate.base import fit_refusal
from runtime.aggregate.streaming import Stream
from runtime.merge import MergeMethod, Result, make_merge
from runtime.merge.diagnostics import round_diagnostics
from runtime.planner import Assignment, RoundPlan, check_merge_guard, unit_seed
from runtime.tasks import Task, TaskData, UnitResult, WorkUnit
from runtime.tasks.base import check_unit_result
from server.session import checkpoint_files as checkpoint
from server.session import federated
from server.session import streamed as streamed_round
from server.session.checkpoint_files import split_server_state
from server.session.config import DivergenceAction, SessionConfig, SessionError, merge_memory_bytes, privacy_settings
from server.session.downloads import Downloads, split_download_state
from server.session.metrics.round_log import NO_ROUND_LOG, RoundLog
from server.session.privacy import CentralPrivacy, privacy_units
from server.session.privacy import describe as describe_privacy
from server.session.privacy import warm as warm_privacy

__all__ = ["DivergenceAction", "Session", "SessionConfig", "SessionError", "SessionPackage", "split_server_state"]


class SessionPackage(Protocol):
    """What a session needs from a package (``server.session.package.Package`` provides it)."""

    task: Task
    data: TaskData
    initial_weights: np.ndarray

    @property
    def fingerprint(self) -> str: ...


class Session:
    """The round loop's state; see the module docstring. Build with ``create`` or ``restore``."""

    def __init__(self, package: SessionPackage, config: SessionConfig, *, directory: Path | None = None,
                 round_log: RoundLog | None = None) -> None:
        self.package = package
        self.task: Task = package.task
        self.data: TaskData = package.data
        # (--codec auto: the task's default; server.session.rules.resolve has already chosen where replays compare)
        self.config = config = config.with_codec_for(self.task.default_codec, compares=False)
        self.plan = RoundPlan(self.data.num_units, config.participants, config.passes, config.seed)
        check_merge_guard(config.merge, self.plan, force=config.force)
        self.merge: MergeMethod = make_merge(config.merge, **config.merge_config)
        self.aggregator: Aggregator = make_aggregator(config.aggregate, **(config.aggregate_config or {}))
        self.spec = self.task.spec()
        unfit = fit_refusal(self.aggregator, config.participants, self.spec.size, merge_memory_bytes())
        if unfit is not None:
            raise SessionError(unfit)
        self.weights = np.array(package.initial_weights, dtype=np.float32)
        self.downloads = Downloads(config.result_codec, self.spec.size, config.seed)  # how merged steps move them
        self.directory = Path(directory) if directory is not None else None
        self.round_log = round_log or NO_ROUND_LOG  # where each round goes besides the history (server.session.metrics)
        self.checkpoints_kept = config.keep_checkpoints  # (the relay keeps more while a ban may undo rounds)
        self.round = 0  # the next round to run = rounds completed
        self.history: list[dict[str, Any]] = []
        self.initial_metrics: dict[str, Any] | None = None
        self.best_weights = self.weights.copy()
        self.best_metric: float | None = None
        self.best_round: int | None = None  # None: the initial weights
        self.stopped: str | None = None  # why the session ended early
        self.checkpoint_id: str | None = None  # the checkpoint last written or read (following.py)
        self._assignments: tuple[int, tuple[Assignment, ...]] | None = None  # the last round asked for
        # Round deadlines (the relay's --round-deadline): units a round merged without are carried into the
        # next one, so each unit is still trained once per pass. ``consumed``: entries of the plan's schedule
        # handed to rounds so far; ``carried``: (pass, unit, round it was first planned in) for the next round.
        self.consumed = 0
        self._previous_delta: np.ndarray | None = None  # the last round's pseudo-gradient (diagnostics' cosine)
        self.carried: list[tuple[int, int, int]] = []
        dp = privacy_settings(config)  # user-level DP: a stage of the merge (server.session.privacy)
        self.privacy = CentralPrivacy(dp, aggregate=config.aggregate) if dp is not None else None
        warm_privacy(self.task.kind, config.dp_delta)  # (the status's local-DP list, computed off any event loop)

    # -- starting and resuming ------------------------------------------------------------------
    @classmethod
    def create(cls, package: SessionPackage, config: SessionConfig, *, directory: Path | None = None,
               round_log: RoundLog | None = None) -> Session:
        """A new session: checks the merge guard, validates the initial weights, writes the first checkpoint."""
        session = cls(package, config, directory=directory, round_log=round_log)
        metrics = session.task.validate(session.weights, session.data.validation) if session.host_validates else {}
        session.initial_metrics = checkpoint.json_safe(metrics)
        session.best_metric = float(metrics[session.task.metric]) if session.host_validates else None
        if session.directory is not None:
            checkpoint.write_session_config(session.directory, checkpoint.session_settings(session))
            checkpoint.rewrite_history(session.directory, [])
            session.round_log.begin(session, new=True)
            session._save(new_entries=[], best_changed=True)
        return session

    @classmethod
    def restore(cls, directory: Path, package: SessionPackage | None = None, *,
                round_log: RoundLog | None = None, read_only: bool = False) -> Session:
        """The session stored in ``directory`` as of its latest checkpoint (``checkpoint_files.read_latest``).

        ``package`` defaults to the folder named in ``session.json``; its fingerprint must match. ``read_only``: a
        relay serving beside the one that writes the folder (``server.relay.sharing``) leaves its files alone."""
        directory = Path(directory)
        stored = checkpoint.read_session_config(directory)
        if package is None:
            if not stored.get("package"):
                raise checkpoint.CheckpointError(f"{directory}: the session names no package folder; pass package=")
            from server.session.package import Package

            package = Package.load(Path(stored["package"]))
        if package.fingerprint != stored["fingerprint"]:
            raise checkpoint.CheckpointError(
                f"{directory} was trained on package {stored['fingerprint']}, not {package.fingerprint}")
        session = cls(package, SessionConfig.from_json(stored["config"]), directory=directory, round_log=round_log)
        state = session.load_point(checkpoint.read_latest(directory),
                                   checkpoint.read_best(directory, repair=not read_only).weights)
        session.history = checkpoint.read_history(directory, int(state["history_length"]))
        if not read_only:
            with contextlib.suppress(OSError):  # (a full disk: the next checkpoint writes the history whole: _save)
                checkpoint.rewrite_history(directory, session.history)  # drop lines written after the checkpoint
            session.round_log.begin(session, new=False)
        return session

    def load_point(self, point: checkpoint.Checkpoint, best_weights: np.ndarray) -> dict[str, Any]:
        """The state as of ``point`` (``restore``, ``rewind``, ``server.session.following``); returns its JSON state."""
        state = point.state
        self.roll_back()  # (reset first: a checkpoint without momentum leaves none)
        self.weights, self.best_weights = (np.array(w, dtype=np.float32) for w in (point.weights, best_weights))
        merge_state, aggregate_state = split_server_state(point.merge_state)
        self.downloads.load_state_dict(split_download_state(dict(point.merge_state))[1])
        self.merge.load_state_dict(merge_state)
        self.aggregator.load_state_dict(aggregate_state)
        self.round, self.stopped, self.initial_metrics = int(state["round"]), state["stopped"], state["initial_metrics"]
        self.checkpoint_id = state.get("checkpoint_id")  # (None in a checkpoint written before it had one)
        self.consumed = int(state.get("consumed", self.round * self.plan.participants_per_round))
        self.carried = [(int(p), int(u), int(r)) for p, u, r in state.get("carried", [])]
        self.best_metric, self.best_round = state["best_metric"], state["best_round"]
        if self.privacy is not None:
            self.privacy.load_state_json(state["privacy"])
        self._assignments, self._previous_delta = None, None
        return state

    def rewind(self, rounds_done: int) -> None:
        """Back to the checkpoint after ``rounds_done`` rounds, to merge the later ones again (a ban's undo,
        ``server.relay.undo``); the files move crash-safely (``checkpoint_files.rewind_files``)."""
        assert self.directory is not None
        point = checkpoint.read_point(checkpoint.round_folder(self.directory, rounds_done))
        best = checkpoint.best_as_of(self.directory, point, self.package.initial_weights)
        history, self.history = self.history, self.history[:int(point.state["history_length"])]
        checkpoint.rewind_files(self.directory, checkpoint.Checkpoint(best, self.spec, point.merge_state, point.state),
                                history=history, kept=self.history, fingerprint=self.package.fingerprint)
        self.load_point(point, best)
        self.downloads.log.clear()  # (no chain may start from weights no longer served: peers fetch them whole)

    # -- the plan -------------------------------------------------------------------------------
    @property
    def num_rounds(self) -> int:
        """The plan's rounds, plus what carried units added (a round shortened by a deadline moves the rest)."""
        cap = self.config.max_rounds
        k = self.plan.participants_per_round
        remaining = len(self.plan.schedule) - self.consumed + len(self.carried)
        planned = self.round + -(-remaining // k) if self.consumed or self.carried else self.plan.num_rounds
        return planned if cap is None else min(cap, planned)

    @property
    def _on_plan(self) -> bool:
        """No round has carried a unit: every round is the plan's slice of k."""
        return not self.carried and self.consumed == self.round * self.plan.participants_per_round

    @property
    def done(self) -> bool:
        return self.stopped is not None or self.round >= self.num_rounds

    @property
    def metric(self) -> str:
        return self.task.metric

    def assignments(self, round_index: int | None = None) -> list[Assignment]:
        """The assignments of ``round_index`` (default: the current round).

        The relay asks for them on every request; they are drawn (a seed per unit) once per round."""
        index = self.round if round_index is None else round_index
        if self._assignments is None or self._assignments[0] != index:
            if self._on_plan or index != self.round:
                if not self._on_plan:
                    raise SessionError(f"round {index} is not the current round ({self.round}) and units were "
                                       "carried: its assignments are in the history")
                self._assignments = (index, tuple(self.plan.units_for_round(index)))
            else:
                self._assignments = (index, tuple(self._carried_round()))
        return list(self._assignments[1])

    def _new_entries(self) -> list[tuple[int, int]]:
        """The schedule's entries the current round takes after its carried units: up to k in all, stopping
        before a unit the round already holds (a carried unit met again in the next pass)."""
        k = self.plan.participants_per_round
        held = {unit for _, unit, _ in self.carried}
        entries: list[tuple[int, int]] = []
        for pass_index, unit in self.plan.schedule[self.consumed:]:
            if len(self.carried) + len(entries) >= k or unit in held:
                break
            entries.append((pass_index, unit))
            held.add(unit)
        return entries

    def _carried_round(self) -> list[Assignment]:
        seed = self.plan.seed
        units = [(p, u) for p, u, _ in self.carried] + self._new_entries()
        return [Assignment(self.round, slot, p, u, unit_seed(seed, p, u)) for slot, (p, u) in enumerate(units)]

    def _first_planned(self, assignment: Assignment) -> int:
        carried = self.carried_from(assignment)
        return assignment.round if carried is None else carried

    def carried_from(self, assignment: Assignment) -> int | None:
        """The round a carried unit was first planned in (None: a unit of this round's own)."""
        if assignment.round != self.round or assignment.slot >= len(self.carried):
            return None
        return self.carried[assignment.slot][2]

    def work_unit(self, assignment: Assignment) -> WorkUnit:
        """What ``task.train_unit`` needs for ``assignment`` (the chunk, or the episode budget, and the seed)."""
        return self.task.work_unit(self.data, assignment.unit_index, assignment.unit_seed,
                                   progress=assignment.round / self.num_rounds)

    # -- completing a round ---------------------------------------------------------------------
    def open_stream(self) -> Stream | None:
        """This round's sum as its results arrive, or None (``server.session.streamed.open_stream``)."""
        return streamed_round.open_stream(self)

    def complete_round(self, results: Sequence[tuple[Assignment, UnitResult]], *,
                       train_seconds: float | None = None, extra: Mapping[str, Any] | None = None,
                       carry_missing: bool = False, contributors: Mapping[int, str] | None = None,
                       carry: Sequence[tuple[int, int, int]] | None = None,
                       streamed: streamed_round.Streamed | None = None) -> dict[str, Any]:
        """Merge the round's results, validate, watch for divergence, record and checkpoint; return the entry.

        ``results`` may miss some assignments (the entry lists them) but not all; their order does not
        matter: they are merged in slot order, so the relay reproduces the simulator bit for bit. With
        ``carry_missing`` (a round deadline) the missing units open the next round, which takes that many
        fewer new units: each unit is still trained once per pass, and the session grows by what was carried.
        ``contributors``: slot -> whose data a result is (a local task's peer), for differential privacy. ``carry``:
        the (pass, unit, round first planned) to carry instead (a ban's undo merges a round again: server.relay.undo).
        ``streamed``: the round's results were summed as they arrived (``open_stream``, keyed by slot; their weights
        here are ``STREAMED``, checked when they came), with a way to read a slot's weights again: the merge gives the
        bits it would give on the weights themselves."""
        if self.done:
            raise SessionError(f"the session is over ({self.stopped or f'all {self.num_rounds} rounds done'})")
        ordered = self._checked_results(results, weights=streamed is None)
        if streamed is not None:
            streamed_round.check_sum(self.round, streamed[0], {a.slot: int(r.num_examples) for a, r in ordered})
        planned = self.assignments()
        done_slots = {a.slot for a, _ in ordered}
        carry = list(carry) if carry is not None else [(a.pass_index, a.unit_index, self._first_planned(a)) for a in
                                                        planned if a.slot not in done_slots] if carry_missing else []
        carried_in = [{"unit": u, "from_round": r} for _, u, r in self.carried]
        evaluated = federated.summary([r for _, r in ordered], self.round)  # (local tasks: server.session.federated)
        federated_best, divergence = federated.judge(self, evaluated) if not self.host_validates else (False, None)
        entry, best_changed = self._merge_and_record(
            [federated.without_federated(r) for _, r in ordered], [a.unit_index for a, _ in ordered],
            streamed=streamed, slots=[a.slot for a, _ in ordered],
            privacy_units=privacy_units(self.task.kind, [a for a, _ in ordered], contributors) if self.privacy else (),
            validate=self.host_validates, fields={
                "missing": [a.unit_index for a in planned if a.slot not in done_slots],
                **({"carried": [u for _, u, _ in carry]} if carry else {}),  # moved into the next round
                **({"carried_in": carried_in} if carried_in else {}),  # units this round took from earlier ones
                **({"federated": checkpoint.json_safe(evaluated)} if evaluated else {}),
            }, train_seconds=train_seconds, extra=extra)
        if divergence is not None:
            federated.apply_divergence(self, entry, divergence)
        self.consumed += len(planned) - len(self.carried)
        self.carried = carry
        return self._advance(entry, best_changed or federated_best)

    def complete_buffer(self, results: Sequence[tuple[int, UnitResult]], *, validate: bool,
                        extra: Mapping[str, Any] | None = None,
                        streamed: streamed_round.Streamed | None = None) -> dict[str, Any]:
        """Buffered asynchronous mode: merge K results (unit index, result already weighted for staleness: see
        ``server.session.buffered``) into the next weights version through the same aggregator and server
        optimizer as a round; validate only when ``validate`` (every few merges). ``streamed``: the results were
        added one at a time to a sum (``open_stream``, keyed by their positions in ``results``, whose weights are
        then ``STREAMED``), with a way to read one again: the same bits, without holding K results at once."""
        if self.done:
            raise SessionError(f"the session is over ({self.stopped or 'all merges done'})")
        if not results:
            raise SessionError(f"merge {self.round} got no results; a merge needs at least one")
        if streamed is None:
            for _, result in results:
                check_unit_result(self.task, result, self.spec)
        else:
            streamed_round.check_sum(self.round, streamed[0],
                                     {index: int(result.num_examples) for index, (_, result) in enumerate(results)})
        evaluated = federated.summary([r for _, r in results], self.round)  # (of the versions they started from)
        entry, best_changed = self._merge_and_record(
            [federated.without_federated(r) for _, r in results], [u for u, _ in results],
            streamed=streamed, slots=list(range(len(results))),
            validate=validate and self.host_validates, fields={
                "version": self.round + 1, **({"federated": checkpoint.json_safe(evaluated)} if evaluated else {})},
            train_seconds=None, extra=extra)
        return self._advance(entry, best_changed)

    def _merge_and_record(self, results: list[UnitResult], units: list[int], *, validate: bool,
                          fields: Mapping[str, Any], train_seconds: float | None, privacy_units: Sequence[str] = (),
                          extra: Mapping[str, Any] | None, streamed: streamed_round.Streamed | None = None,
                          slots: Sequence[int] = ()) -> tuple[dict[str, Any], bool]:
        """Merge, validate (or not), watch for divergence; the history entry and whether the best changed."""
        started = time.perf_counter()
        stage = self.privacy.stage(self.aggregator, self.round, privacy_units) if self.privacy else None
        if streamed is not None:
            merged = streamed_round.merged_from_sum(self, streamed, slots)
        else:
            merged = self.merge.merge(self.weights, [Result(r.weights, int(r.num_examples)) for r in results],
                                      spec=self.spec, aggregator=stage or self.aggregator)
        privacy = {"privacy": self.privacy.commit(stage)} if self.privacy and stage else {}  # (after the merge held)
        merged, download = self.downloads.apply(self.round, self.weights, merged)  # (compressed: the decoded step)
        outliers = [units[i] for i in self.aggregator.last_outliers]
        diagnostics = self._diagnostics(merged)
        merged_at = time.perf_counter()
        metrics = self.task.validate(merged, self.data.validation) if validate else {}
        validated_at = time.perf_counter()

        events: list[dict[str, Any]] = []
        best_changed = False
        divergence = self._divergence(float(metrics[self.metric])) if validate else None
        if divergence is not None:
            event: dict[str, Any] = {"type": "divergence", "reason": divergence, "action": self.config.on_divergence}
            if self.config.on_divergence == "rollback":
                self.roll_back()
                event["restored_round"] = self.best_round
            else:
                self.weights = merged
                self.stopped = f"diverged in round {self.round}: {divergence}"
            events.append(event)
        else:
            self.weights = merged
            if validate and self._better(float(metrics[self.metric]), self.best_metric):
                self.best_metric, self.best_round, self.best_weights = float(metrics[self.metric]), self.round, \
                    merged.copy()
                best_changed = True
        entry: dict[str, Any] = {
            "round": self.round,
            "merge": self.config.name,
            "metrics": checkpoint.json_safe(metrics),  # empty: not validated after this merge
            "participants": len(results),
            "units": units,
            "outliers": outliers,  # units the aggregator set aside or distrusted
            "diagnostics": diagnostics,  # the pseudo-gradient's size, spread and agreement with the last round's
            **({"download": download} if download else {}),  # the step's codec, bytes and relative error
            **fields,
            **privacy,  # epsilon after this round, the clip, the noise
            "examples": int(sum(int(r.num_examples) for r in results)),
            "train": federated.mean_metrics([r.metrics for r in results]),
            "best": {"metric": self.best_metric, "round": self.best_round},
            "seconds": {"train": train_seconds, "merge": merged_at - started, "validate": validated_at - merged_at},
            "events": events,
            "time": time.time(),
            **(extra or {}),  # what the relay adds (the round's host replays)
        }
        return checkpoint.json_safe(entry), best_changed

    def roll_back(self) -> None:
        """A divergence: back to the best weights, with the server's state (merge, aggregator, steps) reset."""
        self.weights = self.best_weights.copy()
        self.merge.reset()
        self.aggregator.reset()
        self.downloads.reset()

    def _diagnostics(self, merged: np.ndarray) -> dict[str, Any]:
        """``runtime.merge.diagnostics`` of the round just merged (the merge method kept its delta)."""
        delta = self.merge.last_delta
        if delta is None:
            return {}
        out = round_diagnostics(delta, self._previous_delta, merged.astype(np.float64) - self.weights, self.spec)
        self._previous_delta = delta
        return out

    def _advance(self, entry: dict[str, Any], best_changed: bool) -> dict[str, Any]:
        self.history.append(entry)
        self.round += 1
        self._assignments = None
        if self.privacy is not None and not self.done:  # stop before a round that would pass the epsilon budget
            self.stopped = self.privacy.budget_stop(self.task.kind, self.assignments())
            entry["events"] += [{"type": "privacy_budget", "reason": self.stopped}] if self.stopped else []
        if self.directory is not None:
            self._save(new_entries=[entry], best_changed=best_changed)
        return entry

    def _checked_results(self, results: Sequence[tuple[Assignment, UnitResult]], *,
                         weights: bool = True) -> list[tuple[Assignment, UnitResult]]:
        if not results:
            raise SessionError(f"round {self.round} got no results; a round needs at least one")
        planned = {a.slot: a for a in self.assignments()}
        seen: set[int] = set()
        for assignment, result in results:
            if planned.get(assignment.slot) != assignment:
                raise SessionError(f"{assignment} is not an assignment of round {self.round}")
            if assignment.slot in seen:
                raise SessionError(f"round {self.round} got two results for slot {assignment.slot}")
            seen.add(assignment.slot)
            if weights:
                check_unit_result(self.task, result, self.spec)
        return sorted(results, key=lambda pair: pair[0].slot)

    def _better(self, value: float, than: float | None) -> bool:
        if not math.isfinite(value):
            return False
        if than is None or not math.isfinite(than):
            return True
        return value > than if self.task.higher_is_better else value < than

    def _divergence(self, value: float) -> str | None:
        if not math.isfinite(value):
            return f"{self.metric} is {value}"
        best = self.best_metric
        if self.task.higher_is_better or best is None or not math.isfinite(best) or best <= 0:
            return None
        if value > self.config.divergence_factor * best:
            return f"{self.metric} {value:.4g} > {self.config.divergence_factor:g} x best {best:.4g}"
        return None

    # -- checkpoints ----------------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        """End the session early (e.g. the admin said so) and record it, so a restart does not resume it."""
        if self.stopped is None:
            self.stopped = reason
            if self.directory is not None:
                self._save(new_entries=[], best_changed=False)

    def note_event(self, event: Mapping[str, Any]) -> None:
        """Add ``event`` to the last round's history entry (a ban's undo), on disk at once."""
        self.history[-1]["events"].append(checkpoint.json_safe(dict(event)))
        if self.directory is not None:
            checkpoint.rewrite_history(self.directory, self.history)

    def _save(self, *, new_entries: list[dict[str, Any]], best_changed: bool) -> None:
        checkpoint.save_session(self, new_entries=new_entries, best_changed=best_changed)
        self.round_log.follow(self)

    # -- reporting ------------------------------------------------------------------------------
    @property
    def host_validates(self) -> bool:
        """Whether the host validates after each merge; a local task's session without a validation split is judged
        by federated evaluation instead (``server.session.federated``)."""
        return self.task.kind != "local" or bool(self.data.validation)

    def metric_series(self) -> list[float | None]:
        """The watched metric after 0 (initial), 1, 2, ... rounds; None where it was not finite. Judged by federated
        evaluation: round r's entry holds the metric of the weights after r rounds, and the last is never judged."""
        if not self.host_validates:
            return [(entry.get("federated") or {}).get("metrics", {}).get(self.metric) for entry in self.history] \
                + [None]
        initial = (self.initial_metrics or {}).get(self.metric)
        return [initial] + [entry["metrics"].get(self.metric) for entry in self.history]

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for the page and the CLI."""
        return checkpoint.json_safe({
            "name": self.config.name,
            "merge": self.merge.name,
            "merge_config": self.merge.to_config(),
            "aggregate": self.aggregator.name,
            "aggregate_config": self.aggregator.to_config(),
            "plan": self.plan.to_json(),
            "round": self.round,
            "num_rounds": self.num_rounds,
            "metric": self.metric,
            "evaluation": "host" if self.host_validates else "federated",  # who judges the model (best, divergence)
            "best": {"metric": self.best_metric, "round": self.best_round},
            "stopped": self.stopped,
            "done": self.done,
            "privacy": describe_privacy(self.privacy, kind=self.task.kind, num_rounds=self.num_rounds,
                                        passes=self.plan.passes, clip=self.config.dp_clip, delta=self.config.dp_delta),
        })
