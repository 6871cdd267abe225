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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.relay.context import RelayContext
from server.relay.refusal import Refusal
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
    relay = request.app.state.relay  # (None: an app that serves only the page)
    if relay is not None:
        relay.disk.note_problem(error)
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
    """The relay's disk: pruned result messages, disk use (``report``, the status's ``storage``) and a full disk.
    After a failed merge the session is reloaded from its last checkpoint and handed to ``serve_restored`` (the
    relay's); when space returns, ``retry_merge`` is called on the event loop."""

    def __init__(self, context: RelayContext, *, serve_restored: Callable[[Session], None],
                 retry_merge: Callable[[], None]) -> None:
        self.context, self.serve_restored, self.retry_merge = context, serve_restored, retry_merge
        self.report: dict[str, Any] = {}
        self.needs_reload = False  # a merge failed on the disk: the session in memory ran ahead of its checkpoint
        self._retry: asyncio.Task[None] | None = None

    # -- bounded disk: pruning after each merge, disk use for the status ------------------------------
    def prune_results(self) -> int:
        """After a merge is checkpointed: empty the messages of merged rounds older than ``keep_results`` (and than
        ``undo_rounds``)."""
        keep, store = self.context.options.keep_results, self.context.store
        if keep is None:
            return 0
        if not self.context.async_mode:  # (a ban's undo merges the last --undo-rounds rounds again: server.relay.undo)
            keep = max(keep, self.context.options.undo_rounds)
        before = self.context.session.round - keep
        pruned = store.prune_arrivals_before(before) if self.context.async_mode else store.prune_before(before)
        if pruned:
            store.count("result_messages_pruned", pruned)
        return pruned

    def measure(self) -> None:
        """Disk use for the status: the SQLite file (with its log) and the session folder (checkpoints, history)."""
        directory, store = self.context.session.directory, self.context.store
        folder = sum(file_size(p) for p in directory.rglob("*")) if directory is not None else 0
        sqlite = store.disk_bytes() if not store.closed else 0
        inside = directory is not None and store.path is not None and directory in store.path.parents
        problem = {"problem": self.report["problem"]} if self.report.get("problem") else {}  # (cleared by a probe)
        self.report = {"sqlite_bytes": sqlite, "checkpoint_bytes": max(0, folder - (sqlite if inside else 0)),
                       "keep_results": self.context.options.keep_results, **problem}

    # -- a full disk ---------------------------------------------------------------------------------
    @property
    def problem(self) -> str | None:
        problem = self.report.get("problem")
        return str(problem) if problem else None

    def note_problem(self, error: BaseException) -> None:
        """A write failed for lack of space: say so (status, 503s) and probe every few seconds until one fits."""
        if not self.problem:
            LOG.warning("storage: %s", error)
        self.report = {**self.report, "problem": describe(error)}
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # (the merge's worker thread: merge_failed starts the probe)
            return
        if self._retry is None or self._retry.done():
            self._retry = loop.create_task(self._retry_when_space_returns())

    def refuse_while_full(self) -> None:
        """New work waits until the disk has room (what a peer trained now could not be merged)."""
        problem = self.problem
        if problem:
            raise Refusal(503, "disk_full", problem, headers={"Retry-After": str(int(STORAGE_RETRY_SECONDS))})

    def merge_failed(self, error: BaseException) -> None:
        """The merge's checkpoint (or its SQLite bookkeeping) did not fit: go back to the last checkpoint and
        try again later."""
        self.needs_reload = True
        self.note_problem(error)
        self.reload()
        self.context.notices.changed()

    def reload(self) -> bool:
        """The session as of its last checkpoint (its in-memory state may have run ahead of the disk); False when
        that failed too (the probe tries again later)."""
        directory = self.context.session.directory
        if not self.needs_reload or directory is None:
            return True
        try:
            restored = Session.restore(directory, self.context.package, round_log=self.context.session.round_log)
        except (OSError, sqlite3.Error, ValueError) as error:  # (anything else is a bug and propagates)
            LOG.warning("storage: the checkpoint could not be reloaded yet: %s", error)
            return False
        self.serve_restored(restored)
        self.needs_reload = False
        return True

    def space_returned(self) -> bool:
        """Whether a checkpoint's worth of bytes (weights, merge state, margin) can be written and synced beside
        the session, and SQLite takes a write: the problem stays reported until then."""
        session, store = self.context.session, self.context.store
        directory = session.directory or (store.path.parent if store.path is not None else Path.cwd())
        probe = Path(directory) / ".space-probe"
        try:
            with probe.open("wb") as handle:
                handle.write(bytes(PROBE_MARGIN_BYTES + 3 * int(session.weights.nbytes)))
                handle.flush()
                os.fsync(handle.fileno())
            store.count("storage_probes")
            return True
        except Exception as error:
            if not is_storage_error(error):
                raise
            return False
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()

    async def _retry_when_space_returns(self) -> None:
        while self.problem:
            await asyncio.sleep(STORAGE_RETRY_SECONDS)
            if not self.space_returned() or not self.reload():
                continue
            self.report = {k: v for k, v in self.report.items() if k != "problem"}  # try: a failure sets it again
            self.retry_merge()
            self.context.notices.changed()
            await asyncio.sleep(0)
