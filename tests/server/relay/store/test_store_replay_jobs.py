"""Replays queued for verification workers: claimed by one worker at a time, a claim that runs out goes to the next,
a late worker's result is not taken, results read back, and what no queued replay needs is dropped."""

from __future__ import annotations

import threading

from virtual_clock import Clock

from server.relay.store import Store, open_store
from server.relay.store.records import FinishedReplay, sha256_hex


def queue(store: Store, n: int, weights: bytes = b"weights-0") -> list[int]:
    return [store.add_replay_job(job=f'{{"slot": {i}}}', task=b'{"task": "t"}', weights=weights, unit=bytes([i]),
                                 engine="native") for i in range(n)]


def test_replays_are_claimed_oldest_first_once_each_and_a_run_out_claim_goes_to_the_next_worker(
        store: Store, clock: Clock) -> None:
    first, second = queue(store, 2)
    assert second > first and store.replay_jobs_waiting() == 2
    a = store.claim_replay_job("worker-a", 10.0)
    assert a is not None and (a.id, a.job, a.unit, a.engine, a.attempts) == (first, '{"slot": 0}', b"\x00", "native", 1)
    assert store.blob(a.task) == b'{"task": "t"}' and store.blob(a.weights) == b"weights-0"
    assert a.weights == sha256_hex(b"weights-0")
    b = store.claim_replay_job("worker-b", 10.0)
    assert b is not None and b.id == second
    assert store.claim_replay_job("worker-c", 10.0) is None  # (both held)

    clock.advance(11.0)  # worker-a died: its claim ran out
    c = store.claim_replay_job("worker-c", 10.0)
    assert c is not None and (c.id, c.attempts) == (first, 2)
    done = FinishedReplay(b"result", "", 1.5, "native")
    assert not store.finish_replay_job(first, "worker-a", done)  # (too late: worker-c holds it)
    assert store.finish_replay_job(first, "worker-c", done)
    assert not store.finish_replay_job(first, "worker-c", done)  # (once)
    assert store.finished_replay_jobs([first, second]) == {first: done} and store.replay_jobs_waiting() == 1
    assert store.finish_replay_job(second, "worker-b", FinishedReplay(b"", "engine crashed", 0.2, "pyodide-cpu"))
    assert store.finished_replay_jobs([second])[second].error == "engine crashed"
    assert store.claim_replay_job("worker-d", 10.0) is None and store.replay_jobs_waiting() == 0


def test_forgotten_replays_take_the_weights_no_replay_needs_with_them(store: Store) -> None:
    old = queue(store, 2, weights=b"weights-0")
    new = queue(store, 1, weights=b"weights-1")
    store.forget_replay_jobs(old)
    assert store.blob(sha256_hex(b"weights-0")) is None and store.blob(sha256_hex(b"weights-1")) == b"weights-1"
    assert store.blob(sha256_hex(b'{"task": "t"}')) is not None  # (the task: still needed)
    store.forget_replay_jobs(new)
    assert store.blob(sha256_hex(b"weights-1")) is None and store.replay_jobs_waiting() == 0
    assert store.finished_replay_jobs(new) == {} and store.finished_replay_jobs([]) == {}
    store.forget_replay_jobs([])
    queue(store, 3)
    store.forget_replay_jobs(None)  # (every one: a relay starting)
    assert store.replay_jobs_waiting() == 0 and store.blob(sha256_hex(b'{"task": "t"}')) is None


def test_workers_asking_at_once_never_share_a_claim(store: Store) -> None:
    """Four workers, each with a connection of its own (as processes on other machines would have)."""
    ids = queue(store, 40)
    claimed: list[tuple[str, int]] = []
    lock = threading.Lock()

    def work(name: str) -> None:
        own = open_store(store.location, clock=store.clock)
        try:
            for _ in range(400):  # (bounded: 40 replays among 4 workers)
                job = own.claim_replay_job(name, 60.0)
                if job is None:
                    if own.replay_jobs_waiting() == 0:
                        return
                    continue
                with lock:
                    claimed.append((name, job.id))
                assert own.finish_replay_job(job.id, name, FinishedReplay(b"r", "", 0.0, "native"))
        finally:
            own.close()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(job_id for _, job_id in claimed) == ids  # each replay claimed exactly once
    assert set(store.finished_replay_jobs(ids)) == set(ids)
