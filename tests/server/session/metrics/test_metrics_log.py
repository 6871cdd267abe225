"""``MetricsLog`` against a sink that records what it is told: each round once and in order, an undo marked where the
history was rewritten, a failing sink warned about once and caught up, a resumed log writing only what its sinks lack,
and the run's end (finished, or left before)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from server.session import checkpoint_files as checkpoint
from server.session.metrics import MetricsLog
from server.session.metrics.entries import scalars, settings


@dataclass
class FakeSession:
    """What the log reads of a session; its entries carry their round, their time and one metric."""

    directory: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None
    rounds: int = 3

    @property
    def done(self) -> bool:
        return self.stopped is not None or len(self.history) >= self.rounds

    def merge(self, loss: float, at: float) -> None:
        self.history.append({"round": len(self.history), "time": at, "metrics": {"loss": loss}, "units": [0, 1]})


@dataclass
class RecordingSink:
    """A sink that notes every call; ``failures``: how many writes fail before it works again."""

    kind: str = "recording"
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    failures: int = 0

    def open(self, saved: Mapping[str, Any] | None, settings: Mapping[str, str]) -> bool:
        self.calls.append(("open", None if saved is None else saved["rounds"]))
        return saved is not None

    def state(self) -> dict[str, Any]:
        return {"run": "one"}

    def write(self, entry: Mapping[str, Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the tracking server does not answer")
        self.calls.append(("write", entry["round"], entry["metrics"]["loss"]))

    def undo(self, step: int, rounds: int) -> None:
        self.calls.append(("undo", step, rounds))

    def end(self, *, finished: bool, stopped: str | None) -> None:
        self.calls.append(("end", finished, stopped))

    def close(self) -> None:
        self.calls.append(("close",))


def session_in(tmp_path: Path) -> FakeSession:
    directory = tmp_path / "session"
    checkpoint.write_session_config(directory, {"config": {"merge": "fedavg", "merge_config": {}}, "task": {
        "name": "arith", "settings": {"lr": 0.003, "operators": ["+"]}}})
    return FakeSession(directory)


def test_each_round_is_written_once_in_order_and_the_end_finishes_the_run(tmp_path: Path) -> None:
    sink, session = RecordingSink(), session_in(tmp_path)
    log = MetricsLog(lambda name: [sink])
    log.begin(session, new=True)
    for r in range(3):
        session.merge(1.0 / (r + 1), 100.0 + r)
        log.follow(session)
    log.close()
    assert sink.calls == [("open", None), ("write", 0, 1.0), ("write", 1, 0.5), ("write", 2, 1 / 3),
                          ("end", True, None), ("close",)]


def test_a_rewritten_history_is_marked_undone_then_merged_again(tmp_path: Path) -> None:
    sink, session = RecordingSink(), session_in(tmp_path)
    session.rounds = 4
    log = MetricsLog(lambda name: [sink])
    log.begin(session, new=True)
    for r in range(3):
        session.merge(1.0, 100.0 + r)
    log.follow(session)
    assert log.flush()
    del session.history[1:]  # a ban's undo: back to the checkpoint after round 1 ...
    session.merge(2.0, 200.0)  # ... and rounds 1 and 2 merged again without the banned peer's results
    log.follow(session)
    for loss in (3.0, 4.0):
        session.merge(loss, 200.0 + loss)
        log.follow(session)
    log.close()
    assert sink.calls[4:] == [("undo", 1, 2), ("write", 1, 2.0), ("write", 2, 3.0), ("write", 3, 4.0),
                              ("end", True, None), ("close",)]


def test_a_failing_sink_is_warned_about_once_and_catches_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink, session = RecordingSink(failures=2), session_in(tmp_path)
    log = MetricsLog(lambda name: [sink])
    log.begin(session, new=True)
    with caplog.at_level(logging.WARNING, logger="peertrain.metrics"):
        for r in range(2):
            session.merge(1.0, 100.0 + r)
            log.follow(session)
            assert log.flush()
        assert [c for c in sink.calls if c[0] == "write"] == []  # (both attempts failed: the session went on)
        session.merge(1.0, 102.0)
        log.follow(session)
        log.close()
    assert [c[1] for c in sink.calls if c[0] == "write"] == [0, 1, 2]
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2, warnings
    assert "recording: could not write round 0 of session (ConnectionError" in warnings[0]
    assert "caught up with session (3 rounds)" in warnings[1]


def test_a_resumed_log_writes_only_the_rounds_its_sinks_lack_and_a_stop_before_the_end_leaves_the_run(
        tmp_path: Path) -> None:
    first, session = RecordingSink(), session_in(tmp_path)
    log = MetricsLog(lambda name: [first])
    log.begin(session, new=True)
    session.merge(1.0, 100.0)
    session.merge(0.5, 101.0)
    log.follow(session)
    log.close()  # the relay stops between rounds: the run is left, not finished
    assert first.calls[-2:] == [("end", False, None), ("close",)]

    again = RecordingSink()
    log = MetricsLog(lambda name: [again])
    log.begin(session, new=False)  # restored from its folder
    session.merge(0.25, 102.0)
    log.follow(session)
    log.close()
    assert again.calls == [("open", 2), ("write", 2, 0.25), ("end", True, None), ("close",)]

    fresh = RecordingSink()
    log = MetricsLog(lambda name: [fresh])
    log.begin(FakeSession(session.directory), new=True)  # a new session in the same folder: a new run
    log.close()
    assert fresh.calls == [("open", None), ("end", False, None), ("close",)]


def test_an_entry_gives_its_numbers_and_the_settings_their_text() -> None:
    entry = {"round": 4, "time": 1.5, "merge": "fedavg", "participants": 2, "units": [3, 0], "stale": True,
             "metrics": {"val_loss": 2.5, "odd name?": 1}, "diagnostics": {"cosine_previous": None,
                                                                           "tensor_rms": {"max": 0.1, "largest": "h"}},
             "best": {"metric": float("nan"), "round": None}}
    assert scalars(entry) == {"participants": 2.0, "metrics/val_loss": 2.5, "metrics/odd name_": 1.0,
                              "diagnostics/tensor_rms/max": 0.1}
    assert settings({"config": {"merge": "fedavg", "merge_config": {}, "max_rounds": None},
                     "task": {"settings": {"operators": ["+"], "lr": 0.003}}}) == {
        "config/merge": "fedavg", "config/merge_config": "{}", "config/max_rounds": "null",
        "task/settings/operators": '["+"]', "task/settings/lr": "0.003"}


def test_a_closed_log_takes_the_session_up_again_at_its_next_round(tmp_path: Path) -> None:
    """A relay's app closes its session's log as it stops (``Relay.close``); one opened again writes on."""
    sinks: list[RecordingSink] = []

    def new_sink(name: str) -> list[RecordingSink]:
        sinks.append(RecordingSink())
        return sinks[-1:]

    session = session_in(tmp_path)
    log = MetricsLog(new_sink)
    log.begin(session, new=True)
    session.merge(1.0, 100.0)
    log.follow(session)
    log.close()
    log.close()  # (twice: the app's lifespan, then serve's own way out)
    session.merge(0.5, 101.0)
    log.follow(session)
    log.close()
    assert [sink.calls for sink in sinks] == [
        [("open", None), ("write", 0, 1.0), ("end", False, None), ("close",)],
        [("open", 1), ("write", 1, 0.5), ("end", False, None), ("close",)]]
