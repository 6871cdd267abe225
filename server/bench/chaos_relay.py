"""What ``peertrain bench chaos`` (``server.bench.chaos``) runs against: a real ``peertrain serve``
(``server.harness.RelayProcess``: killed with SIGKILL and started again on the same port) and native peers
(``server.harness.NativePeer``) that do what the browser's worker does and start over through every refused
connection and 5xx; the killer learns what they are doing from ``Uploads``, as events."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from runtime.protocol import Job
from server.harness.native_peer import NativePeer, PeerHooks, RetryPolicy
from server.harness.relay_process import EXAMPLES, RelayProcess
from server.harness.serve_command import ServeCommand

__all__ = ["EXAMPLES", "RelayProcess", "Uploads", "chaos_relay", "retrying_peer", "wait_until"]

HOLD_SECONDS = 2.0  # peers hold their work requests briefly: a killed relay's held requests fail fast
# Through a restart the peers start over from asking for work, again and again (the deadline ends it first).
RETRY = RetryPolicy(resend=0, restarts=100_000, retry_5xx=True, first_delay_s=0.05, max_delay_s=0.5)


def chaos_relay(serve: ServeCommand, log: Path) -> RelayProcess:
    """``peertrain serve`` with examples/ on its path; port 0 at the first start, the same port at a restart."""
    return RelayProcess(serve, log=log, examples=True, start_timeout_s=120)


@dataclass
class Uploads:
    """What the peers are doing, for the killer: uploads in flight, and what came back, under one condition
    (the killer waits on it; no polling)."""

    changed: threading.Condition = field(default_factory=threading.Condition)
    in_flight: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    slots: int = 0  # results a merge takes (0: unknown, no merge is ever seen)
    per_round: bool = True  # sync: a round's slots; async: any results (the buffer)
    full_rounds: list[int] = field(default_factory=list)  # merges the accepted results started, in order
    service_unavailable: list[str] = field(default_factory=list)  # the reasons of 503 answers
    accepted_slots: dict[int, set[int]] = field(default_factory=dict)
    # A one-shot action run in the peer's own thread the moment a merge's last result is answered `accepted`, under
    # ``changed`` (the killer's merge moment: no thread switch between that answer and the kill, so the kill lands
    # before a merge of a few milliseconds is on disk).
    armed: Callable[[], None] | None = None

    def send_result(self, job: Job, send: Callable[[], httpx.Response]) -> httpx.Response:
        """One upload, counted in flight while it is (the peer's view: sent, not answered yet)."""
        with self.changed:
            self.in_flight += 1
            self.changed.notify_all()
        answered: httpx.Response | None = None
        try:
            answered = send()
            return answered
        finally:
            with self.changed:
                self.in_flight -= 1
                if answered is not None:
                    self.note(answered, job)
                self.changed.notify_all()

    def note(self, answer: httpx.Response, job: Job) -> None:
        if answer.status_code != 200:
            code = ""
            with contextlib.suppress(ValueError, AttributeError):
                code = str(answer.json().get("error", ""))
            self.by_status[f"{answer.status_code} {code}"] += 1
            return
        self.by_status["accepted"] += 1
        if not self.per_round:
            if self.slots and self.by_status["accepted"] % self.slots == 0:
                self.merge_started(self.by_status["accepted"])
            return
        round_index = job.round
        slots = self.accepted_slots.setdefault(round_index, set())
        slots.add(job.slot)
        if self.slots and len(slots) == self.slots and round_index not in self.full_rounds:
            self.merge_started(round_index)

    def merge_started(self, merge: int) -> None:
        self.full_rounds.append(merge)
        action, self.armed = self.armed, None
        if action is not None:
            action()

    def on_answer(self, answer: httpx.Response) -> None:
        if answer.status_code == 503:
            with contextlib.suppress(ValueError, AttributeError):
                self.service_unavailable.append(str(answer.json().get("error")))


def retrying_peer(url: str, uploads: Uploads, stop: threading.Event, deadline: float) -> NativePeer:
    """The browser worker's loop, natively, starting over while the relay is down or answers 5xx; its uploads
    go through ``uploads``. (Call ``start()``.)"""
    return NativePeer(url, hooks=PeerHooks(send_result=uploads.send_result, on_answer=uploads.on_answer),
                      retry=RETRY, hold_s=HOLD_SECONDS, wait_cap_s=0.2, deadline=deadline, stop=stop)


def wait_until(uploads: Uploads, ready: Callable[[], bool], limit_s: float) -> bool:
    """Until ``ready()`` holds (looked at on every change the peers report) or ``limit_s`` passes."""
    with uploads.changed:
        return uploads.changed.wait_for(ready, timeout=limit_s)
