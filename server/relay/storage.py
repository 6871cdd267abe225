"""A full disk: the relay says so with 503, keeps its last good checkpoint, and resumes when space returns.

Every write the relay makes goes to SQLite (peers, leases, results) or to the session folder (checkpoints,
history). When the disk is full those writes fail with ``sqlite3.OperationalError`` ("database or disk is
full") or ``OSError`` (ENOSPC, EDQUOT). A request whose write fails is answered ``503 disk_full`` with a reason
and ``Retry-After`` (nothing half-written stays: each SQLite statement is its own transaction). A merge whose
checkpoint fails leaves the previous checkpoint in force (a round's folder is written in full before
``latest`` moves), so the relay reloads the session from it, refuses new work with the same 503 (peers would
train for nothing), keeps the round's results in SQLite and tries the merge again every few seconds; the
first one that fits clears the problem. The status's ``storage.problem`` tells the page.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.relay.refusal import Refusal

if TYPE_CHECKING:
    from server.session.package import Package
    from server.session.session import Session

LOG = logging.getLogger("peertrain.relay")
STORAGE_RETRY_SECONDS = 2.0  # how often a merge refused by the disk is tried again (and what peers are told)
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_storage_error(error: BaseException) -> bool:
    """A write refused for lack of space (or a disk that fails), not a programming error."""
    if isinstance(error, sqlite3.OperationalError):
        text = str(error).lower()
        return "full" in text or "disk" in text or "i/o" in text
    return isinstance(error, OSError) and error.errno in FULL_ERRNOS | {errno.EIO, errno.EROFS}


def describe(error: BaseException) -> str:
    detail = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return f"the relay cannot write to its disk ({detail}); it keeps its last checkpoint and resumes when space returns"


def disk_full_response(request: Request, error: Exception) -> Response:
    """The app's handler for a write that failed for lack of space: 503 ``disk_full``; anything else is not
    ours to answer and stays a 500."""
    if not is_storage_error(error):
        LOG.error("unexpected %s: %s", type(error).__name__, error)
        return JSONResponse({"error": "internal", "message": f"{type(error).__name__}: {error}"}, status_code=500)
    relay = getattr(request.app.state, "relay", None)
    if relay is not None:
        relay.note_storage_problem(error)
    return JSONResponse({"error": "disk_full", "message": describe(error)}, status_code=503,
                        headers={"Retry-After": str(int(STORAGE_RETRY_SECONDS))})


EXCEPTION_HANDLERS: dict[Any, Any] = {sqlite3.OperationalError: disk_full_response, OSError: disk_full_response}


class StorageGuard:
    """Needs from the relay: ``session``, ``package``, ``storage``, ``paused``, ``start_session``, ``store``,
    ``schedule_merge`` and ``changed``."""

    session: Session
    package: Package
    storage: dict[str, Any]
    _storage_retry: asyncio.Task[None] | None = None
    _needs_reload: bool = False

    @property
    def storage_problem(self) -> str | None:
        problem = self.storage.get("problem")
        return str(problem) if problem else None

    def note_storage_problem(self, error: BaseException) -> None:
        """A write failed for lack of space: say so (status, 503s) and probe every few seconds until one fits."""
        if not self.storage_problem:
            LOG.warning("storage: %s", error)
        self.storage = {**self.storage, "problem": describe(error)}
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # (the merge's worker thread: merge_failed_on_storage starts the probe)
            return
        if self._storage_retry is None or self._storage_retry.done():
            self._storage_retry = loop.create_task(self._retry_when_space_returns())

    def refuse_while_full(self) -> None:
        """New work waits until the disk has room (what a peer trained now could not be merged)."""
        problem = self.storage_problem
        if problem:
            raise Refusal(503, "disk_full", problem, headers={"Retry-After": str(int(STORAGE_RETRY_SECONDS))})

    def merge_failed_on_storage(self, error: BaseException) -> None:
        """The merge's checkpoint (or its SQLite bookkeeping) did not fit: go back to the last checkpoint and
        try again later."""
        self._needs_reload = True
        self.note_storage_problem(error)
        self.reload_from_checkpoint()
        self.changed()

    def reload_from_checkpoint(self) -> bool:
        """The session as of its last checkpoint (its in-memory state may have run ahead of the disk)."""
        from server.session.session import Session

        directory = self.session.directory
        if not self._needs_reload or directory is None:
            return True
        try:
            restored = Session.restore(directory, self.package)
        except (OSError, sqlite3.Error, ValueError) as error:
            LOG.warning("storage: the checkpoint could not be reloaded yet: %s", error)
            return False
        paused = self.paused
        self.start_session(restored, self.store)
        self.paused = paused
        self._needs_reload = False
        return True

    async def _retry_when_space_returns(self) -> None:
        while self.storage_problem:
            await asyncio.sleep(STORAGE_RETRY_SECONDS)
            if not self.reload_from_checkpoint():
                continue
            self.storage = {k: v for k, v in self.storage.items() if k != "problem"}  # try: a failure sets it again
            self.schedule_merge()
            self.changed()
            await asyncio.sleep(0)

    # (from the relay)
    paused: bool
    store: Any

    def start_session(self, session: Session, store: Any) -> None:
        raise NotImplementedError

    def schedule_merge(self) -> None:
        raise NotImplementedError

    def changed(self) -> None:
        raise NotImplementedError
