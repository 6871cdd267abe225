"""Replays on verification workers (``serve --remote-replays``; ``peertrain verify-worker --store URL``), a part of
the relay's verification: the relay queues each replay in its store instead of running it, any number of workers on
any machine that reaches the store claim them, replay them on the engine the relay names and send the result back;
a collector thread here hands each result to the replay's future, where ``Verifier.judge`` compares it as it would
a local one. The relay spends no CPU on replays, and never waits on a worker that died: a claim lasts
``verify-worker --claim-seconds`` and then goes to the next worker that asks (``ReplayJobStore``).

Why the store and not Ray (which sweeps use): a relay's verification workers need nothing but the store they share
with it (a PostgreSQL URL; a SQLite file on the relay's own machine), claims that outlive a worker are rows, and a
host that runs a public session needs no cluster for it. A worker replays on the engine the relay names: the task
must be importable there (a built-in task, or the task's module installed on the worker's machine).
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future
from typing import Any

from runtime.protocol import Job
from server.browser_assets.engines import EngineError
from server.relay.store import Store
from server.relay.verify import Replay, replayed

LOG = logging.getLogger("peertrain.relay")
POLL_SECONDS = 0.1  # how often the collector asks the store for finished replays (while some are out)


class StoreReplays:
    """``server.relay.verify.Replays`` through ``store``: a replay is a row a worker claims; ``workers`` is 0 (none
    in this process)."""

    workers = 0

    def __init__(self, store: Store, task_info: dict[str, Any], engine: str, *,
                 poll_seconds: float = POLL_SECONDS) -> None:
        self.store, self.engine, self.poll_seconds = store, engine, poll_seconds
        self.task = json.dumps(task_info, sort_keys=True, default=str).encode()
        self._pending: dict[int, tuple[Future[Replay], Job, bytes]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        store.forget_replay_jobs(None)  # (a previous relay's: nobody waits for them now)
        self._collector = threading.Thread(target=self._collect, daemon=True, name="remote-replays")
        self._collector.start()

    def replay(self, job: Job, weights_message: bytes, unit_message: bytes | None) -> Future[Replay]:
        future: Future[Replay] = Future()
        future.set_running_or_notify_cancel()
        job_id = self.store.add_replay_job(job=job.dumps(), task=self.task, weights=weights_message,
                                           unit=unit_message or b"", engine=self.engine)
        with self._lock:
            self._pending[job_id] = (future, job, weights_message)
        self.store.count("replays_queued_for_workers")
        return future

    def _collect(self) -> None:
        while not self._closed.wait(self.poll_seconds):
            with self._lock:
                ids = list(self._pending)
            if not ids:
                continue
            try:
                finished = self.store.finished_replay_jobs(ids)
                if finished:
                    self.store.forget_replay_jobs(list(finished))
            except Exception as error:  # (the store closing under a relay that stops; else said and tried again)
                if not self._closed.is_set():
                    LOG.warning("remote replays: reading finished replays failed: %s", error)
                continue
            for job_id, result in finished.items():
                with self._lock:
                    future, job, weights = self._pending.pop(job_id)
                if result.error:  # the worker's engine failed: the host's trouble, no verdict on anyone
                    future.set_exception(EngineError(f"verification worker: {result.error}"))
                    continue
                try:
                    future.set_result(replayed(job, weights, result.message, result.seconds, result.engine))
                except Exception as error:  # (a worker's message that does not decode: no verdict either)
                    future.set_exception(EngineError(f"verification worker sent an unreadable replay: {error}"))

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            pending, self._pending = self._pending, {}
        for future, _, _ in pending.values():
            future.cancel()
        self._collector.join(timeout=5)
