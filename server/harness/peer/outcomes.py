"""What a peer's steps come to (``server.harness.peer.relay_peer``): a refusal as the peer took it, the weights and
unit it fetched, the result it uploads, and its log of everything it saw."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import httpx

from runtime.protocol import PeerAction


class Unanswered(Exception):
    """A request got no answer (connection refused, reset, timed out) or a 5xx, and the retry policy gave up."""


@dataclass(frozen=True)
class Refused:
    """A refusal as the peer took it: the relay's status, code and message, what the protocol says to do next and
    the Retry-After the relay asked for (seconds; 1 when it named none) and the ticket a refused join was given."""

    status: int
    code: str
    message: str
    action: PeerAction
    retry_after: float = 1.0
    ticket: str = ""


@dataclass(frozen=True)
class Fetched:
    weights: bytes  # the weights message the job trains from (a chain of steps where the peer rebuilt from one)
    unit: bytes | None  # the unit's data (data tasks)


@dataclass(frozen=True)
class Result:
    """What a peer uploads; ``honest``: trained as a page trains (the upload hook may replace it)."""

    body: bytes
    honest: bool = True


@dataclass
class PeerLog:
    """What the peer saw."""

    refusals: list[tuple[int, str]] = field(default_factory=list)  # (status, code) of every 4xx/5xx kept
    accepted: list[tuple[int, int]] = field(default_factory=list)  # (round, slot) of every accepted upload
    results: Counter[str] = field(default_factory=Counter)  # "accepted", "403 not_leased", ...
    trained: int = 0
    uploads_skipped_training: int = 0
    rejoins: int = 0
    unanswered: int = 0  # requests given up on (each a resend or a restart followed)
    weights_bytes: int = 0  # bytes of weights received (full messages and chains of steps)
    join_waits: int = 0  # joins refused 429 (join_rate, too_many_peers) and tried again
    join_seconds: list[float] = field(default_factory=list)  # each sign-in: its first ask to admitted
    chains: int = 0  # weights rebuilt from a chain of steps


def retry_after(response: httpx.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("retry-after", "1") or 1))
    except ValueError:  # (an HTTP date: not sent by the relay)
        return 1.0
