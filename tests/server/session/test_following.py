"""Reading a session folder that another relay writes (``server.session.following``): a relay starting beside the one
holding the session reads the folder again while a checkpoint is being written, and no reader beside a live writer
moves the writer's files; a reader follows the writer's checkpoints, a ban's undo that merged a round again included."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from server.session import checkpoint_files as checkpoint
from server.session import following
from server.session.config import SessionConfig
from server.session.package import Package
from server.session.session import Session


def written(package: Package, directory: Path) -> Session:
    session = Session.create(package, SessionConfig(participants=2, passes=2), directory=directory)
    assert checkpoint.latest_folder(directory).is_dir() and (directory / checkpoint.BEST_DIR).is_dir()
    return session


def test_a_reader_beside_the_writer_leaves_its_best_folder_alone(package: Package, tmp_path: Path) -> None:
    """Between the two renames that swap a new best in, only ``best.old`` is on disk: a reader beside the writer
    (following, a replica opening, an export) reads it where it is; the writer's own restart (a crash there) moves
    it back."""
    session = written(package, tmp_path / "s")
    best, previous = tmp_path / "s" / checkpoint.BEST_DIR, tmp_path / "s" / (checkpoint.BEST_DIR + ".old")
    os.replace(best, previous)  # (the writer, between its renames)
    np.testing.assert_array_equal(checkpoint.read_best(tmp_path / "s", repair=False).weights, session.best_weights)
    beside = Session.restore(tmp_path / "s", package, read_only=True)
    np.testing.assert_array_equal(beside.weights, session.weights)
    assert not best.exists() and previous.is_dir()  # (the writer's next rename finds its place free)
    Session.restore(tmp_path / "s", package)  # (the writer itself, restarted: the previous best goes back)
    assert best.is_dir() and not previous.exists()


def test_a_relay_opening_beside_the_holder_reads_again_while_a_checkpoint_is_written(
        package: Package, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = written(package, tmp_path / "s")
    state = checkpoint.latest_folder(tmp_path / "s") / checkpoint.STATE_FILE
    aside = state.with_name("state.json.aside")
    os.replace(state, aside)  # (the folder as a read in the middle of a write finds it)
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # the first failed read: the write completes
        pauses.append(seconds)
        os.replace(aside, state)
    monkeypatch.setattr(following.time, "sleep", pause)
    opened = following.open_beside(tmp_path / "s", package)
    assert pauses == [following.OPEN_PAUSE_SECONDS] and opened.round == session.round
    np.testing.assert_array_equal(opened.weights, session.weights)


def test_a_folder_that_stays_unreadable_is_an_error_after_the_tries(
        package: Package, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written(package, tmp_path / "s")
    (checkpoint.latest_folder(tmp_path / "s") / checkpoint.STATE_FILE).unlink()
    pauses: list[float] = []
    monkeypatch.setattr(following.time, "sleep", pauses.append)
    monkeypatch.setattr(following, "OPEN_TRIES", 3)
    with pytest.raises(following.READ_ERRORS):
        following.open_beside(tmp_path / "s", package)
    assert len(pauses) == 2


def merged_once(session: Session, *, drop: int) -> None:
    """One round of ``session`` merged from its units trained honestly, less the first ``drop`` of them."""
    results = [(a, session.task.train_unit(session.weights, session.work_unit(a))) for a in session.assignments()]
    session.complete_round(results[drop:])


def test_a_reader_follows_an_undo_that_merged_the_round_again(package: Package, tmp_path: Path) -> None:
    """The holder merges round 0 from two results; a ban's undo rewinds it and merges round 0 again from one (the
    banned peer's result left out): the same round number, other weights. The reader beside it takes them on (it
    compared the round and the stop only, kept the undone weights and handed them out until the next merge)."""
    holder = written(package, tmp_path / "s")
    merged_once(holder, drop=0)
    beside = following.open_beside(tmp_path / "s", package)
    assert following.checkpoint_ahead(beside) is None  # (nothing new)
    undone = beside.weights.copy()
    holder.rewind(0)
    merged_once(holder, drop=1)
    assert holder.round == beside.round == 1 and not np.array_equal(holder.weights, undone)
    ahead = following.checkpoint_ahead(beside)
    assert ahead is not None
    following.follow(beside, ahead)
    np.testing.assert_array_equal(beside.weights, holder.weights)
    assert following.checkpoint_ahead(beside) is None
