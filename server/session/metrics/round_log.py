"""What a session and its metrics log say to each other: ``RoundLog`` (``Session.create(..., round_log=)``; the session
calls ``begin`` when it starts and ``follow`` after each checkpoint), what the log reads of the session
(``FollowedSession``), and the log of a session without sinks (``NO_ROUND_LOG``). ``MetricsLog`` (``log.py``) is the
one that writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class FollowedSession(Protocol):
    """What the log reads of a session (``server.session.session.Session``)."""

    directory: Path | None
    history: list[dict[str, Any]]
    stopped: str | None

    @property
    def done(self) -> bool: ...


class RoundLog(Protocol):
    """Where a session's rounds go besides ``history.jsonl`` (``Session.create(..., round_log=)``); its owner closes
    it (``Relay.close``, the command that made it)."""

    def begin(self, session: FollowedSession, *, new: bool) -> None:
        """``session`` starts (``new``: created in its folder; else restored from it)."""

    def follow(self, session: FollowedSession) -> None:
        """``session``'s history as its last checkpoint wrote it."""

    def close(self) -> None:
        """End the session's runs (its owner's call, never the session's)."""


class NoRoundLog:
    """A session without metrics sinks."""

    def begin(self, session: FollowedSession, *, new: bool) -> None:
        return None

    def follow(self, session: FollowedSession) -> None:
        return None

    def close(self) -> None:
        return None


NO_ROUND_LOG = NoRoundLog()
