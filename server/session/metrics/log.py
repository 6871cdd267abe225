"""``MetricsLog``: a session's history mirrored into its metrics sinks, on a thread of its own.

A session tells its log two things (``round_log.RoundLog``, the Protocol ``server.session.session.Session``
calls): ``begin`` (a session created in its folder, or restored from it) and ``follow`` (its history after a
checkpoint: a new round, a stop, rounds merged again after a ban's undo). The session's thread only takes a snapshot
and queues it; the log's thread brings each sink to it:

    kept   = the rounds the sinks hold that are still the history's (told apart by their wall times)
    undo   = a sink holding rounds beyond ``kept``: the ``undone`` marker at ``kept`` (the package docstring)
    write  = the history's rounds the sink lacks, in order; a session that is done ends its run (FINISHED)

A sink that fails is warned about once and tried again at the next snapshot, from where it stopped: the session
never waits for it. What each sink holds is kept in ``metrics_log.json`` in the session folder (``MARKER_FILE``), so
a resumed session continues each run where it stopped. Consecutive snapshots waiting in the queue are taken as one
(the last), so a slow sink catches up in one pass.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from server.session import checkpoint_files as checkpoint
from server.session.metrics import entries
from server.session.metrics.round_log import FollowedSession

MARKER_FILE = "metrics_log.json"
CLOSE_SECONDS = 60.0  # longest ``close`` waits for the queue to be written (a tracking server that stopped answering)
LOG = logging.getLogger("peertrain.metrics")


class MetricsSink(Protocol):
    """One tool's run of a session (``TensorBoardSink``, ``MLflowSink``); ``kind`` is its key in the marker."""

    kind: str

    def open(self, saved: Mapping[str, Any] | None, settings: Mapping[str, str]) -> bool:
        """Continue the run ``saved`` names (True), or start a new one with ``settings`` (False)."""

    def state(self) -> dict[str, Any]:
        """What the marker keeps to find the run again."""

    def write(self, entry: Mapping[str, Any]) -> None: ...

    def undo(self, step: int, rounds: int) -> None:
        """``rounds`` rounds from ``step`` on were set aside; what follows replaces them."""

    def end(self, *, finished: bool, stopped: str | None) -> None:
        """The run's end: the session is over (``finished``), or its process stops before."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Snapshot:
    """A session as a checkpoint left it, taken on the session's thread."""

    directory: Path
    history: tuple[dict[str, Any], ...]
    done: bool
    stopped: str | None

    @classmethod
    def of(cls, session: FollowedSession) -> Snapshot:
        assert session.directory is not None, "a session's metrics need its folder (the resume marker lives there)"
        return cls(Path(session.directory), tuple(session.history), session.done, session.stopped)


@dataclass(frozen=True)
class Operation:
    """What the log's thread is asked: ``begin``, ``follow``, ``flush`` (``written`` set when done) or ``close``."""

    kind: Literal["begin", "follow", "flush", "close"]
    snapshot: Snapshot | None = None
    new: bool = False
    written: threading.Event | None = None


@dataclass
class SinkState:
    """A sink and what it holds: the history's first ``rounds`` rounds, and an undo it has yet to mark."""

    sink: MetricsSink
    saved: dict[str, Any] | None  # the marker's word on its run, until the run is open
    rounds: int = 0
    undo_at: int | None = None
    undone: int = 0
    opened: bool = False
    ended: bool = False
    failing: bool = False  # (warned; the next success says it caught up)

    def marker(self) -> dict[str, Any]:
        pending = {"undo_at": self.undo_at, "undone": self.undone} if self.undo_at is not None else {}
        return {**(self.sink.state() if self.opened else self.saved or {}), "rounds": self.rounds, **pending}


class MetricsLog:
    """``sinks(name)``: a session's sinks, its folder's name naming its run. One session at a time: ``begin`` of
    another leaves the previous one's runs (ended KILLED unless that session was done). ``close`` ends the runs and
    the thread; a later snapshot starts both again, as a resumed session (a relay's app closed and opened again)."""

    def __init__(self, sinks: Callable[[str], Sequence[MetricsSink]]) -> None:
        self._sinks_for = sinks
        self._lock = threading.Lock()  # (the session's threads put; the thread and its queue are made under it)
        self._queue: queue.Queue[Operation] = queue.Queue()
        self._thread: threading.Thread | None = None
        # the log thread's own state (one thread at a time: a new one waits for the one closed before it)
        self._states: list[SinkState] = []
        self._directory: Path | None = None
        self._settings: dict[str, str] = {}
        self._times: list[float] = []  # the wall times of the rounds the most advanced sink holds
        self._last: Snapshot | None = None

    # -- the session's side ----------------------------------------------------------------------------------------
    def begin(self, session: FollowedSession, *, new: bool) -> None:
        self._put(Operation("begin", Snapshot.of(session), new=new))

    def follow(self, session: FollowedSession) -> None:
        self._put(Operation("follow", Snapshot.of(session)))

    def flush(self, timeout: float = CLOSE_SECONDS) -> bool:
        """Wait until what was queued before is written (or failed: the sinks try again at the next round); False
        when ``timeout`` passed first."""
        written = threading.Event()
        self._put(Operation("flush", written=written))
        return written.wait(timeout)

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Write what is queued, end the session's runs (KILLED unless it was done) and stop the thread."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._queue.put(Operation("close"))
            self._thread = None
        thread.join(timeout)
        if thread.is_alive():
            LOG.warning("metrics: gave up after %.0f s waiting for the sinks to take the last rounds; history.jsonl "
                        "holds every round", timeout)

    def _put(self, operation: Operation) -> None:
        with self._lock:
            if self._thread is None:
                previous, self._queue = self._queue, queue.Queue()
                self._thread = threading.Thread(target=self._run, args=(self._queue, previous), name="metrics-log",
                                                daemon=True)
                self._thread.start()
            self._queue.put(operation)

    # -- the log's thread ------------------------------------------------------------------------------------------
    def _run(self, operations_queue: queue.Queue[Operation], previous: queue.Queue[Operation]) -> None:
        previous.join()  # (the thread closed before this one has left its runs)
        while True:
            operations = [operations_queue.get()]
            while True:
                try:
                    operations.append(operations_queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if not self._run_all(operations):
                    return
            finally:
                for _ in operations:
                    operations_queue.task_done()

    def _run_all(self, operations: list[Operation]) -> bool:
        """Do ``operations`` in order (a follow followed by another of the same session is left to the later one);
        False after a close."""
        for operation, after in zip(operations, [*operations[1:], None], strict=True):
            if operation.kind == "follow" and after is not None and after.kind == "follow" and \
                    same_folder(operation.snapshot, after.snapshot):
                continue  # (a later snapshot of the same session brings this one's rounds too)
            if operation.kind == "close":
                self._leave()
                self._directory = None  # (a later snapshot resumes the session from its marker)
                return False
            try:
                self._do(operation)
            except Exception:  # (a bug here must not end the thread: later rounds still get their chance)
                LOG.exception("metrics: could not write the session's metrics")
            finally:
                if operation.written is not None:
                    operation.written.set()
        return True

    def _do(self, operation: Operation) -> None:
        snapshot = operation.snapshot
        if snapshot is None:  # (a flush: everything before it is done)
            return
        if operation.kind == "begin" or snapshot.directory != self._directory:
            self._begin(snapshot, new=operation.new)
        self._follow(snapshot)

    def _begin(self, snapshot: Snapshot, *, new: bool) -> None:
        if not new and snapshot.directory == self._directory:
            return  # the session followed now, restored from its checkpoint (a full disk's reload): its runs go on
        self._leave()
        self._directory = snapshot.directory
        marker = {} if new else read_marker(snapshot.directory)
        self._times = [float(t) for t in marker.get("times", [])]
        self._settings = entries.settings(checkpoint.read_session_config(snapshot.directory))
        self._states = []
        for sink in self._sinks_for(snapshot.directory.name):
            saved = marker.get(sink.kind) if isinstance(marker.get(sink.kind), dict) else None
            state = SinkState(sink, saved)
            if saved is not None:
                state.rounds = min(int(saved.get("rounds", 0)), len(self._times))
                state.undo_at, state.undone = saved.get("undo_at"), int(saved.get("undone", 0))
            self._states.append(state)

    def _follow(self, snapshot: Snapshot) -> None:
        self._last = snapshot
        times = [entries.wall_time(entry) for entry in snapshot.history]
        kept = common_prefix(self._times, times)
        for state in self._states:
            if state.rounds > kept:  # rounds this sink shows were set aside (a ban's undo) or never checkpointed
                state.undone = max(state.undone, state.rounds - kept) if state.undo_at is not None else \
                    state.rounds - kept
                state.undo_at = kept if state.undo_at is None else min(state.undo_at, kept)
                state.rounds = kept
            self._bring_up_to_date(state, snapshot)
        self._times = times[:max((state.rounds for state in self._states), default=0)]
        self._save_marker()

    def _bring_up_to_date(self, state: SinkState, snapshot: Snapshot) -> None:
        sink = state.sink
        try:
            if not state.opened:
                saved = {**state.saved, "rounds": state.rounds} if state.saved is not None else None
                continued = sink.open(saved, self._settings)
                state.opened = True
                if not continued:
                    state.rounds, state.undo_at, state.undone = 0, None, 0
            if state.undo_at is not None:
                sink.undo(state.undo_at, state.undone)
                state.undo_at, state.undone = None, 0
            for entry in snapshot.history[state.rounds:]:
                sink.write(entry)
                state.rounds += 1
            if snapshot.done and not state.ended:
                sink.end(finished=True, stopped=snapshot.stopped)
                state.ended = True
        except Exception as error:  # (a side channel: history.jsonl keeps the round; tried again at the next one)
            if not state.failing:
                LOG.warning("metrics: %s: could not write round %d of %s (%s: %s); the session goes on, and the "
                            "next round tries again", sink.kind, state.rounds, snapshot.directory.name,
                            type(error).__name__, error)
            state.failing = True
            return
        if state.failing:
            LOG.warning("metrics: %s: caught up with %s (%d rounds)", sink.kind, snapshot.directory.name, state.rounds)
            state.failing = False

    def _leave(self) -> None:
        """End the runs of the session followed so far and close its sinks."""
        last = self._last
        for state in self._states:
            if not state.opened:
                continue
            try:
                if not state.ended:
                    done = last is not None and last.done
                    state.sink.end(finished=done, stopped=last.stopped if last is not None else None)
                    state.ended = True
                state.sink.close()
            except Exception as error:
                LOG.warning("metrics: %s: could not end the run (%s: %s)", state.sink.kind, type(error).__name__,
                            error)
        self._states, self._last = [], None

    def _save_marker(self) -> None:
        assert self._directory is not None
        marker: dict[str, Any] = {"times": self._times}
        marker.update({state.sink.kind: state.marker() for state in self._states})
        try:
            checkpoint.write_text_atomic(self._directory / MARKER_FILE, json.dumps(marker) + "\n")
        except OSError as error:  # (a full disk: the next round writes it again)
            LOG.warning("metrics: could not write %s (%s)", self._directory / MARKER_FILE, error)


def read_marker(directory: Path) -> dict[str, Any]:
    """What a session folder's marker says (nothing where there is none, or it cannot be read)."""
    try:
        marker = json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def same_folder(first: Snapshot | None, second: Snapshot | None) -> bool:
    return first is not None and second is not None and first.directory == second.directory


def common_prefix(first: Sequence[float], second: Sequence[float]) -> int:
    count = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        count += 1
    return count
