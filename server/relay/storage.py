"""The relay's disk: bounded by pruning merged rounds' messages, measured for the status, and a full disk.

After each merge is checkpointed the result messages of rounds older than ``--keep-results`` are emptied
(``Store.prune_before``; their audit rows stay), and the disk use is measured for the status.

A full disk: the relay says so with 503, keeps its last good checkpoint, and resumes when space returns.

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
import contextlib
import errno
import logging
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.relay.refusal import Refusal

if TYPE_CHECKING:
    from server.session.package import Package
    from server.session.session import Session

LOG = logging.getLogger("peertrain.relay")
STORAGE_RETRY_SECONDS = 2.0  # how often a merge refused by the disk is tried again (and what peers are told)
PROBE_MARGIN_BYTES = 1 << 20  # what a probe writes beyond three copies of the weights
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


# How libraries that do not raise OSError say it (safetensors: "I/O error: No space left on device (os error 28)").
FULL_WORDS = (f"os error {errno.ENOSPC}", "no space left on device", "disk quota exceeded")


def is_storage_error(error: BaseException) -> bool:
    """A write refused for lack of space (or a disk that fails), not a programming error."""
    if isinstance(error, sqlite3.OperationalError):
        text = str(error).lower()
        return "full" in text or "disk" in text or "i/o" in text
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno in FULL_ERRNOS | {errno.EIO, errno.EROFS}
    return any(word in str(error).lower() for word in FULL_WORDS)


def describe(error: BaseException) -> str:
    detail = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return f"the relay cannot write to its disk ({detail}); it keeps its last checkpoint and resumes when space returns"


async def disk_full_response(request: Request, error: Exception) -> Response:
    """The app's handler for a write that failed for lack of space: 503 ``disk_full``; anything else is not
    ours to answer and stays a 500. (Async: Starlette runs a plain function in a worker thread, and the probe
    for returning space is a task on the event loop.)"""
    if not is_storage_error(error):
        LOG.error("unexpected %s: %s", type(error).__name__, error, exc_info=error)  # (the traceback, as before)
        return JSONResponse({"error": "internal", "message": f"{type(error).__name__}: {error}"}, status_code=500)
    relay = getattr(request.app.state, "relay", None)
    if relay is not None:
        relay.note_storage_problem(error)
    return JSONResponse({"error": "disk_full", "message": describe(error)}, status_code=503,
                        headers={"Retry-After": str(int(STORAGE_RETRY_SECONDS))})


EXCEPTION_HANDLERS: dict[Any, Any] = {sqlite3.OperationalError: disk_full_response, OSError: disk_full_response}


def file_size(path: Path) -> int:
    """A file's size, 0 for a folder or a file removed meanwhile (a checkpoint being replaced)."""
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


class StorageGuard:
    """The relay's disk: pruned result messages, disk use, and a full disk. Needs from the relay: ``session``,
    ``package``, ``storage``, ``options``, ``paused``, ``async_mode``, ``start_session``, ``store``,
    ``schedule_merge`` and ``changed``."""

    session: Session
    package: Package
    storage: dict[str, Any]
    _storage_retry: asyncio.Task[None] | None = None
    _needs_reload: bool = False

    # -- bounded disk: pruning after each merge, disk use for the status ------------------------------
    def prune_results(self) -> int:
        """After a merge is checkpointed: empty the messages of merged rounds older than ``keep_results``."""
        keep = self.options.keep_results
        if keep is None:
            return 0
        before = self.session.round - keep
        pruned = self.store.prune_arrivals_before(before) if self.async_mode else self.store.prune_before(before)
        if pruned:
            self.store.count("result_messages_pruned", pruned)
        return pruned

    def measure_storage(self) -> None:
        """Disk use for the status: the SQLite file (with its log) and the session folder (checkpoints, history)."""
        directory = self.session.directory
        folder = sum(file_size(p) for p in directory.rglob("*")) if directory is not None else 0
        sqlite = self.store.disk_bytes() if not self.store.closed else 0
        inside = directory is not None and directory in self.store.path.parents
        problem = {"problem": self.storage["problem"]} if self.storage.get("problem") else {}  # (cleared by a probe)
        self.storage = {"sqlite_bytes": sqlite, "checkpoint_bytes": max(0, folder - (sqlite if inside else 0)),
                        "keep_results": self.options.keep_results, **problem}

    # -- a full disk ---------------------------------------------------------------------------------
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

    def space_returned(self) -> bool:
        """Whether a checkpoint's worth of bytes (weights, merge state, margin) can be written and synced beside
        the session, and SQLite takes a write: the problem stays reported until then."""
        directory = self.session.directory or self.store.path.parent
        probe = Path(directory) / ".space-probe"
        try:
            with probe.open("wb") as handle:
                handle.write(bytes(PROBE_MARGIN_BYTES + 3 * int(self.session.weights.nbytes)))
                handle.flush()
                os.fsync(handle.fileno())
            self.store.count("storage_probes")
            return True
        except Exception as error:
            if not is_storage_error(error):
                raise
            return False
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()

    async def _retry_when_space_returns(self) -> None:
        while self.storage_problem:
            await asyncio.sleep(STORAGE_RETRY_SECONDS)
            if not self.space_returned() or not self.reload_from_checkpoint():
                continue
            self.storage = {k: v for k, v in self.storage.items() if k != "problem"}  # try: a failure sets it again
            self.schedule_merge()
            self.changed()
            await asyncio.sleep(0)

    # (from the relay)
    paused: bool
    store: Any
    options: Any

    @property
    def async_mode(self) -> bool:
        raise NotImplementedError

    def start_session(self, session: Session, store: Any) -> None:
        raise NotImplementedError

    def schedule_merge(self) -> None:
        raise NotImplementedError

    def changed(self) -> None:
        raise NotImplementedError
