"""The session as the page and the command line see it (``StatusReport``, a part of the relay): ``GET /api/session``,
each event of ``GET /api/events``, what the session waits for in words, what it defends against; and the samples
of the model the page shows (``Samples``, generated after a merge by ``server.relay.merge_schedule``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server.relay.admin import SessionAdmin
from server.relay.checks import describe_defenses
from server.relay.context import Part, RelayContext
from server.relay.people import Participants
from server.relay.replay_checks import ReplayChecks
from server.relay.round_mode import RoundMode
from server.relay.storage import StorageGuard
from server.session.session import Session

HISTORY_LENGTH = 200  # rounds of history in the status (the page's chart); the full history is exported
CREDIT_TOP = 10  # volunteers and teams of the leaderboard the status carries (GET /api/credit has more)


@dataclass
class Samples:
    """A few outputs of the model for the page, each with whether it is right, from the weights after ``round``
    merged rounds (None: none yet)."""

    latest: list[dict[str, Any]] = field(default_factory=list)
    round: int | None = None

    @staticmethod
    def generate(session: Session, weights: np.ndarray) -> list[dict[str, Any]]:
        """The samples of ``weights`` (generating text can cost several validations)."""
        return [{"text": s.text, "ok": s.ok} for s in session.task.samples(weights, session.data.validation)]

    def show(self, latest: list[dict[str, Any]], round_index: int) -> None:
        self.latest, self.round = latest, round_index

    def clear(self) -> None:
        self.latest, self.round = [], None


class StatusReport(Part):
    """``mode``: the relay's round mode at the time of the call (a new session brings its own)."""

    def __init__(self, context: RelayContext, *, mode: Callable[[], RoundMode], people: Participants,
                 replays: ReplayChecks, disk: StorageGuard, admin: SessionAdmin, samples: Samples) -> None:
        self.context, self.mode, self.people, self.replays = context, mode, people, replays
        self.disk, self.admin, self.samples = disk, admin, samples
        self._event: tuple[int, str] | None = None  # (version, the status as an event), shared by every stream

    def status(self) -> dict[str, Any]:
        session, store, options = self.session, self.store, self.options
        active = store.active_peers(options.peer_timeout)
        participants = self.people.participants()
        credit = self.people.credit.table()
        return {
            **session.describe(),
            "task": session.task.describe(),
            "fingerprint": self.context.package.fingerprint,
            "paused": self.admin.is_paused(),
            "pause_from": self.admin.pause_from,  # (pause-after-round: the round no work of is handed out)
            "merging": self.context.merging,
            "replica": self.context.replica,  # (this relay serves beside the one holding the session: sharing.py)
            "peers": {"connected": len(active), "joined": store.peer_count(), "needed": options.min_peers,
                      "addresses": store.addresses(options.peer_timeout),
                      "per_address": options.max_peers_per_address},  # (0: no cap; a page's workers fit in it)
            "round_progress": self.mode().progress(),
            "waiting": self.waiting(),
            "mode": session.config.mode,
            "history": session.history[-HISTORY_LENGTH:],
            "initial_metrics": session.initial_metrics,
            "samples": self.samples.latest,
            "samples_round": self.samples.round,
            "counters": store.counters(),
            "defenses": self.defenses(),
            "participants": participants,
            "volunteers": self.people.volunteers(participants),  # (the page's table: server.relay.people)
            "credit": {"unit": credit["unit"], "total": credit["total"], "top": credit["volunteers"][:CREDIT_TOP],
                       "teams": credit["teams"][:CREDIT_TOP], "count": len(credit["volunteers"])},
            "public_model": options.public_model,
            "storage": self.disk.report,
            "version": self.context.notices.version,
        }

    def waiting(self) -> str | None:
        """What the session waits for and why, in words for the page (None: it is not waiting on anything: a peer
        that asks is handed work, or the session is over or merging). The rules behind it: docs/liveness.md."""
        if self.session.done or self.context.merging:
            return None
        if self.admin.is_paused():
            return "paused by the host"
        if self.disk.problem:
            return f"the relay cannot write ({self.disk.problem}); the session goes on when space returns"
        return self.mode().waiting()

    def event(self) -> str:
        """The status as a server-sent event, built once per version and shared by every stream (200 pages
        watching used to build it 200 times per change: most of the relay's time under load)."""
        version = self.context.notices.version
        if self._event is None or self._event[0] != version:
            self._event = (version, f"data: {json.dumps(self.status())}\n\n")
        return self._event[1]

    def defenses(self) -> dict[str, Any]:
        """What this session defends against and what it does not, in words for the page."""
        session = self.session
        return describe_defenses(self.options, session.aggregator.name, session.aggregator.to_config(),
                                 session.task.kind, self.replays.describe(), stream=self.context.async_mode)
