"""Archiving a session's files so a new session can start in the same folder (``POST /api/admin/session``).

The previous session's files (checkpoints, history, the relay's SQLite state, which metrics runs it wrote) move to
``archive/NNN/`` (the next free number), so nothing is lost; the package folder stays where it is, and so does a
local MLflow store (``mlflow.db``: the new session is a new run in it, ``server.session.metrics``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from server.session import checkpoint_files
from server.session.metrics.log import MARKER_FILE

SQLITE_FILES = ("relay.sqlite3", "relay.sqlite3-wal", "relay.sqlite3-shm")
SESSION_FILES = (checkpoint_files.SESSION_FILE, checkpoint_files.HISTORY_FILE, checkpoint_files.LATEST_FILE,
                 checkpoint_files.ROUNDS_DIR, checkpoint_files.BEST_DIR, MARKER_FILE, *SQLITE_FILES)


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
