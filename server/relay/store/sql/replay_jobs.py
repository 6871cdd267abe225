"""Replays queued for verification workers (``serve --remote-replays``, ``peertrain verify-worker``): the
``replay_jobs`` table (one row a replay: what to replay, who holds its claim until when, its result) and ``blobs``
(the task's description and each round's weights, kept once under their sha256 while a replay needs them).

A claim is one UPDATE whose WHERE both picks the oldest open replay and requires it still open: two workers asking at
once never both get it (PostgreSQL re-checks the WHERE on the row the first one changed and the second gets none;
SQLite runs writes one at a time); the second asks again."""

from __future__ import annotations

from collections.abc import Collection

from server.relay.store.records import FinishedReplay, ReplayJob, sha256_hex
from server.relay.store.sql.database import TablePart

OPEN = "finished IS NULL AND (claimed_until IS NULL OR claimed_until < ?)"  # (the argument: now)


def ids_in(ids: Collection[int]) -> tuple[str, tuple[int, ...]]:
    """``IN (?, ?, ...)`` for ``ids``, and the arguments."""
    listed = tuple(int(i) for i in ids)
    return "(" + ", ".join("?" * len(listed)) + ")", listed


class SQLReplayJobs(TablePart):
    """``server.relay.store.concepts.ReplayJobStore`` on the ``replay_jobs`` and ``blobs`` tables."""

    def add_replay_job(self, *, job: str, task: bytes, weights: bytes, unit: bytes, engine: str) -> int:
        task_digest, weights_digest = sha256_hex(task), sha256_hex(weights)
        with self.connection.transaction() as db:
            for digest, data in ((task_digest, task), (weights_digest, weights)):
                db.execute("INSERT INTO blobs (digest, data) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING",
                           (digest, data))
            cursor = db.execute("INSERT INTO replay_jobs (job, task, weights, unit, engine, queued) VALUES "
                                "(?, ?, ?, ?, ?, ?) RETURNING id",
                                (job, task_digest, weights_digest, unit, engine, self.clock()))
            return int(cursor.fetchone()[0])

    def blob(self, digest: str) -> bytes | None:
        rows = self.connection.run("SELECT data FROM blobs WHERE digest = ?", (digest,))
        return bytes(rows[0][0]) if rows else None

    def claim_replay_job(self, worker: str, seconds: float) -> ReplayJob | None:
        now = self.clock()
        rows = self.connection.run(
            "UPDATE replay_jobs SET worker = ?, claimed_until = ?, attempts = attempts + 1 WHERE id = (SELECT id FROM "
            f"replay_jobs WHERE {OPEN} ORDER BY id LIMIT 1) AND {OPEN} RETURNING id, job, task, weights, unit, "
            "engine, attempts", (worker, now + seconds, now, now))
        if not rows:
            return None
        r = rows[0]
        return ReplayJob(int(r[0]), str(r[1]), str(r[2]), str(r[3]), bytes(r[4]), str(r[5]), int(r[6]))

    def finish_replay_job(self, job_id: int, worker: str, result: FinishedReplay) -> bool:
        return self.connection.change(
            "UPDATE replay_jobs SET finished = ?, message = ?, error = ?, seconds = ?, ran_on = ? WHERE id = ? AND "
            "worker = ? AND finished IS NULL", (self.clock(), result.message, result.error, result.seconds,
                                                result.engine, job_id, worker)) > 0

    def finished_replay_jobs(self, job_ids: Collection[int]) -> dict[int, FinishedReplay]:
        if not job_ids:
            return {}
        listed, args = ids_in(job_ids)
        rows = self.connection.run("SELECT id, message, error, seconds, ran_on FROM replay_jobs WHERE finished IS NOT "
                                   f"NULL AND id IN {listed}", args)
        return {int(r[0]): FinishedReplay(bytes(r[1]), str(r[2]), float(r[3]), str(r[4])) for r in rows}

    def forget_replay_jobs(self, job_ids: Collection[int] | None) -> None:
        if job_ids is not None and not job_ids:
            return
        listed, args = ids_in(job_ids or ())
        with self.connection.transaction() as db:
            db.execute("DELETE FROM replay_jobs" + ("" if job_ids is None else f" WHERE id IN {listed}"), args)
            db.execute("DELETE FROM blobs WHERE digest NOT IN (SELECT task FROM replay_jobs UNION SELECT weights FROM "
                       "replay_jobs)")

    def replay_jobs_waiting(self) -> int:
        return int(self.connection.run("SELECT COUNT(*) FROM replay_jobs WHERE finished IS NULL")[0][0])
