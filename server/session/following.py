"""Following a session that another relay checkpoints: a relay serving beside the one that holds the session
(``server.relay.sharing``) takes on each checkpoint that relay writes to the shared session folder, writing nothing
itself. ``checkpoint_ahead`` reads one (in a worker thread); ``follow`` takes it on (on the event loop)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from server.session import checkpoint_files as checkpoint

if TYPE_CHECKING:
    from server.session.metrics.round_log import RoundLog
    from server.session.session import Session, SessionPackage

OPEN_TRIES = 50  # a relay starting beside the holder reads the session folder again this often (0.1 s apart) while
#                  the holder writes a checkpoint into it (a read mid-write fails: the next one finds it whole)
OPEN_PAUSE_SECONDS = 0.1
READ_ERRORS = (OSError, ValueError, KeyError, checkpoint.CheckpointError)  # (what a read mid-write may raise)


@dataclass(frozen=True)
class Ahead:
    """A checkpoint past the session's state: its point, the best weights and the history as of it, and the weights
    of the versions merged in between that are still on disk (results may have started from them)."""

    point: checkpoint.Checkpoint
    best: np.ndarray
    history: list[dict[str, Any]]
    between: dict[int, np.ndarray]


def checkpoint_ahead(session: Session) -> Ahead | None:
    """The latest checkpoint in ``session``'s folder where it is past the session's state (a merge, a stop, a ban's undo
    that merged rounds again up to the same number); None
    where it is not, or is being written or pruned right now (the next look finds it). Only reads."""
    directory = session.directory
    assert directory is not None
    try:
        folder = checkpoint.latest_folder(directory)
        state = json.loads((folder / checkpoint.STATE_FILE).read_text())
        # (the round alone misses a ban's undo that merged rounds again up to the same number, other weights)
        if (int(state["round"]), state["stopped"], state.get("checkpoint_id")) == \
                (session.round, session.stopped, session.checkpoint_id):
            return None
        point = checkpoint.read_point(folder)
        best = checkpoint.read_best(directory, repair=False).weights
        history = checkpoint.read_history(directory, int(point.state["history_length"]))
        between = {}
        for rounds_done in range(session.round + 1, int(point.state["round"])):
            older = checkpoint.round_folder(directory, rounds_done)
            if older.is_dir():
                between[rounds_done] = np.array(checkpoint.read_point(older).weights, dtype=np.float32)
    except READ_ERRORS:
        return None
    return Ahead(point, best, history, between)


def open_beside(directory: Path, package: SessionPackage, round_log: RoundLog | None = None) -> Session:
    """The session in ``directory`` as of the newest checkpoint the relay holding it wrote, opened without writing
    (``Session.restore(read_only=True)``), read again while that relay is writing one (up to ``OPEN_TRIES`` times):
    the last error is raised."""
    from server.session.session import Session

    for _ in range(OPEN_TRIES - 1):
        try:
            return Session.restore(directory, package, round_log=round_log, read_only=True)
        except READ_ERRORS:
            time.sleep(OPEN_PAUSE_SECONDS)
    return Session.restore(directory, package, round_log=round_log, read_only=True)  # (its error is raised)


def follow(session: Session, ahead: Ahead) -> None:
    """``session`` takes on the state of ``ahead``, writing nothing."""
    session.load_point(ahead.point, ahead.best)
    session.history = ahead.history
