"""Creating a new session over HTTP (admin only): ``POST /api/admin/session``.

The new session trains the relay's package again with new round and merge settings, in the same
session folder; the previous session's files (checkpoints, history, SQLite state) move to
``archive/NNN/`` first, so nothing is lost. The settings are checked (merge hyperparameters, the
merge guard) before anything on disk changes: a refused request leaves the running session as it was.
Peers of the old session are asked to join again (their tokens lived in the old SQLite file).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from server import checkpoint
from server.session import Session, SessionConfig
from server.store import Store

if TYPE_CHECKING:
    from server.relay import Relay

SESSION_FILES = (checkpoint.SESSION_FILE, checkpoint.HISTORY_FILE, checkpoint.LATEST_FILE, checkpoint.ROUNDS_DIR,
                 checkpoint.BEST_DIR, "relay.sqlite3", "relay.sqlite3-wal", "relay.sqlite3-shm")
SETTABLE = ("merge", "merge_config", "participants", "passes", "seed", "max_rounds", "force", "on_divergence",
            "divergence_factor")


class SessionRequestError(ValueError):
    """A session request that cannot be honoured; the message says why."""


def config_from_request(body: Any, current: SessionConfig) -> SessionConfig:
    """The new session's config: the current one with the given fields replaced, checked by a dry build."""
    if not isinstance(body, dict):
        raise SessionRequestError("the body must be a JSON object of session settings")
    unknown = sorted(set(body) - set(SETTABLE) - {"replace"})
    if unknown:
        raise SessionRequestError(f"unknown session setting(s) {unknown}; known: {list(SETTABLE)}")
    try:
        return dataclasses.replace(current, **{key: body[key] for key in SETTABLE if key in body})
    except (TypeError, ValueError) as error:
        raise SessionRequestError(f"bad session settings: {error}") from error


def check_config(relay: Relay, config: SessionConfig) -> None:
    """Build the session in memory only: the merge guard and hyperparameters are checked, nothing is written."""
    try:
        Session(relay.package, config)
    except (TypeError, ValueError) as error:
        raise SessionRequestError(str(error)) from error


def archive_session(directory: Path) -> Path:
    """Move the session's files into ``archive/NNN`` (the next free number); returns that folder."""
    archive_root = directory / "archive"
    archive_root.mkdir(exist_ok=True)
    number = 1 + max((int(p.name) for p in archive_root.iterdir() if p.name.isdigit()), default=0)
    target = archive_root / f"{number:03d}"
    target.mkdir()
    for name in SESSION_FILES:
        if (directory / name).exists():
            shutil.move(str(directory / name), str(target / name))
    return target


def replace_session(relay: Relay, config: SessionConfig) -> Path:
    """Archive the current session and start ``config`` in its folder (blocking: run it in a thread)."""
    directory = relay.session.directory
    if directory is None:
        raise SessionRequestError("this relay's session has no folder; it cannot be replaced")
    relay.store.close()
    archived = archive_session(directory)
    relay.start_session(Session.create(relay.package, config, directory=directory),
                        Store(directory / "relay.sqlite3"))
    return archived
