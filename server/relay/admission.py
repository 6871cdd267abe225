"""Who may join: a token bucket of joins per client address, and a cap on live peers per address. (Behind a
reverse proxy the address is the one uvicorn's proxy-headers middleware reads for the relay's trusted proxies,
``serve --forwarded-allow-ips``: ``server.relay.app``.)

Anyone with an open session's URL can join, and one client can open thousands of identities in seconds; each
identity can then take a unit (and hold its lease) or vote in the merge. Limiting joins per address does not
stop a determined attacker with many addresses (robust aggregation and, later, replay checks do that), but it
keeps one machine from flooding the session and keeps the relay responsive.
"""

from __future__ import annotations

import hmac
import math
import time
from dataclasses import dataclass, field

from server.relay.context import RelayContext
from server.relay.refusal import Refusal

MAX_TRACKED_ADDRESSES = 10_000  # buckets kept in memory; full (idle) ones are dropped first past this


@dataclass
class TokenBucket:
    """``burst`` joins at once, refilled at ``rate`` per second."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, now: float) -> float:
        """Take one token; returns 0 when taken, else the seconds until one is there."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate if self.rate > 0 else math.inf


@dataclass
class JoinLimiter:
    """Token buckets per address; ``rate <= 0`` turns the limit off."""

    rate: float
    burst: int
    buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def admit(self, address: str, now: float | None = None) -> None:
        """Refuse with 429 ``join_rate`` (and ``Retry-After``) when ``address`` has no join left."""
        if self.rate <= 0:
            return
        now = time.monotonic() if now is None else now
        bucket = self.buckets.get(address)
        if bucket is None:
            self._make_room(now)
            bucket = self.buckets[address] = TokenBucket(self.rate, float(self.burst), float(self.burst), now)
        wait = bucket.take(now)
        if wait > 0:
            raise Refusal(429, "join_rate", f"too many joins from {address}: {self.burst} at once, then "
                          f"{self.rate:g} per second; try again in {wait:.1f} s",
                          headers={"Retry-After": str(max(1, math.ceil(wait)))})

    def _make_room(self, now: float) -> None:
        if len(self.buckets) < MAX_TRACKED_ADDRESSES:
            return
        refilled = [a for a, b in self.buckets.items() if b.tokens + (now - b.updated) * b.rate >= b.burst]
        for address in refilled or list(self.buckets)[: len(self.buckets) // 2]:
            del self.buckets[address]


class Admission:
    """Joins (the join code, address bans, the cap of live peers per address, the join rate) and who a request
    is from (a peer's token, its ban), for ``Relay.join`` and ``Relay.peer``."""

    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self.joins = JoinLimiter(context.options.join_rate, context.options.join_burst)

    def join(self, address: str, *, agent: str = "", join_code: str = "") -> tuple[str, str]:
        """A new peer's id and token. Refused with the join code missing or wrong (403 ``join_code``), from the
        address of a banned peer (403 ``banned``), past the address's join rate or its cap of live peers (429,
        ``Retry-After``)."""
        options, store = self.context.options, self.context.store
        if options.join_code and not hmac.compare_digest(join_code.encode(), options.join_code.encode()):
            raise Refusal(403, "join_code", "this session needs a join code")
        if options.ban_addresses and store.address_banned(address):
            raise Refusal(403, "banned", f"a peer from {address} was banned from this session for a result that "
                          "failed verification")
        cap = options.max_peers_per_address
        if cap > 0 and store.live_peers_at(address, options.peer_timeout) >= cap:
            raise Refusal(429, "too_many_peers", f"{address} already has {cap} live peers in this session",
                          headers={"Retry-After": str(max(1, int(options.peer_timeout)))})
        self.joins.admit(address)
        credentials = store.add_peer(agent, address)
        self.context.notices.work_changed()
        return credentials

    def peer(self, peer_id: str, token: str, *, touch: bool = True) -> str:
        """``peer_id`` when its token is right and it is not banned; marks it as seen (it counts as connected) unless
        ``touch`` is False."""
        store = self.context.store
        if not token or not store.authenticate(peer_id, token, touch=touch):
            raise Refusal(401, "unauthorized", "missing or wrong peer token; join first (POST /api/join)")
        banned = store.ban_reason(peer_id)
        if banned is not None:
            raise Refusal(403, "banned", f"this peer is banned from the session: {banned}")
        return peer_id
