"""Training for the native peers of ``peertrain bench attacks`` (``attack_peers``): every honest result, and the
honest result an attacker starts from, is trained on one shared ``server.harness.peer.Trainer``.

A unit is a function of the weights, the unit and its seed, so which peer (or process) trains it does not matter:
a round's units train in a pool of ``workers`` processes, shared by the run's peers, natively or on the browser's
own engine (Pyodide under Node, which gives a page's bytes). A relay that replays on Pyodide refuses results trained
on another engine for a task whose units part ways across engines (bytetext, CartPole: its ``GET /api/task`` says
``devices: ["cpu"]``), so there the peers train as a page does; elsewhere natively, which is faster.

Round 0 starts from the package's initial weights in every run, so its honest results are kept and reused across
the runs of a task: the same bytes a peer would upload (its ``seconds`` metric aside).
"""

from __future__ import annotations

from typing import Any

from server.harness.peer.trainer import BLAS_THREADS, Retention, Trainer

__all__ = ["BLAS_THREADS", "Trainer", "bench_trainer", "peer_engine"]  # (the bench's entry reads BLAS_THREADS)
CACHE_ENTRIES = 256
FIRST_ROUND = Retention(first_round_only=True, entries=CACHE_ENTRIES)


def peer_engine(task_info: dict[str, Any], replay_engine: str) -> str:
    """The engine the bench's peers train on for a relay that replays on ``replay_engine``: the relay's own where it
    refuses results of other engines (its task says ``devices: ["cpu"]``), else native."""
    return replay_engine if replay_engine == "pyodide" and task_info.get("devices") == ["cpu"] else "native"


def bench_trainer(task_info: dict[str, Any], workers: int, engine: str) -> Trainer:
    """The training processes of one task on one engine for the bench's runs (the caller closes it)."""
    return Trainer(task_info, engine=engine, workers=max(1, workers), keep=FIRST_ROUND)
