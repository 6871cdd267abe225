"""Who may join: joins per client address at a rate, first come first served (a refused joiner is given a ticket for
its place), and a cap on live peers per address. (Behind a
reverse proxy the address is the one uvicorn's proxy-headers middleware reads for the relay's trusted proxies,
``serve --forwarded-allow-ips``: ``server.relay.app``.)

Anyone with an open session's URL can join, and one client can open thousands of identities in seconds; each
identity can then take a unit (and hold its lease) or vote in the merge. Limiting joins per address does not
stop a determined attacker with many addresses (robust aggregation and, later, replay checks do that), but it
keeps one machine from flooding the session and keeps the relay responsive.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from dataclasses import dataclass, field

from server.relay.context import RelayContext
from server.relay.refusal import Refusal

MAX_TRACKED_ADDRESSES = 10_000  # addresses kept in memory; idle ones (no queue, a full burst) are dropped first
JOIN_QUEUE = 1_000  # places one address's queue holds; past it a join is refused with no ticket (a flood)
TICKET_GRACE_S = 60.0  # a ticket admits from its time until this much later; then it is only a place at the back


@dataclass
class AddressQueue:
    """One address's joins as a generic cell rate algorithm (a token bucket kept as one time): ``due`` is when the
    joins admitted and promised so far would have used up the address's rate; a join is admitted at once while
    ``due`` is within ``burst`` joins of now. A join refused is promised the next place all the same (``due`` moves
    on by one interval), so the joiners behind one address are let in in the order they first asked."""

    due: float
    serial: int = 0
    redeemed: dict[int, float] = field(default_factory=dict)  # ticket serial -> its expiry, while it could be shown


@dataclass
class JoinLimiter:
    """Joins per address: ``burst`` at once, then ``rate`` per second, first come first served; ``rate <= 0`` turns
    the limit off.

    A join past the rate is refused 429 ``join_rate`` with ``Retry-After`` and a ticket for the next free place
    (its time and a number, signed with this relay's secret for this address). Shown again with the join
    (``{"ticket": ...}``) from its time on, the ticket admits at once whatever the joins since; shown early, it is
    refused with the seconds still to wait and keeps its place. So n joiners behind one address are all in within
    ``(n - burst) / rate`` seconds of the first and the retry a client makes on ``Retry-After``, whoever is unlucky
    on the network, while the address still gets no more than its rate. A ticket is good once, for
    ``TICKET_GRACE_S`` after its time; an unused one costs its place (later joiners are not moved up)."""

    rate: float
    burst: int
    queues: dict[str, AddressQueue] = field(default_factory=dict)
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def admit(self, address: str, now: float | None = None, *, ticket: str = "") -> None:
        """Admit a join from ``address`` or refuse it with 429 ``join_rate``, ``Retry-After`` and (while the
        address's queue has room) a ticket in the refusal's body."""
        if self.rate <= 0:
            return
        now = time.monotonic() if now is None else now
        queue = self.queues.get(address)
        if queue is None:
            self._make_room(now)
            queue = self.queues[address] = AddressQueue(due=now)
        if ticket and self._redeem(address, queue, ticket, now):
            return
        interval = 1.0 / self.rate
        due = max(queue.due, now) + interval
        turn = due - max(self.burst, 1) * interval  # when this join fits within the burst
        if turn <= now:
            queue.due = due
            return
        if turn - now > JOIN_QUEUE * interval:
            raise self._refusal(address, turn - now, "", "its queue is full")
        queue.due, queue.serial = due, queue.serial + 1
        raise self._refusal(address, turn - now, self._ticket(address, queue.serial, turn), "")

    def _redeem(self, address: str, queue: AddressQueue, ticket: str, now: float) -> bool:
        """True when ``ticket`` admits now; refused (the same ticket, the seconds left) when it is early; False when
        it is not one of this address's tickets, was used or has expired (the join then queues as a new one)."""
        try:
            serial_text, turn_text, signature = ticket.split(".")
            serial, turn = int(serial_text), int(turn_text) / 1000
        except ValueError:
            return False
        expected = self._ticket(address, serial, turn).rsplit(".", 1)[1]
        if not hmac.compare_digest(signature.encode(), expected.encode()) or serial in queue.redeemed:
            return False
        if now > turn + TICKET_GRACE_S:
            return False
        if now < turn:
            raise self._refusal(address, turn - now, ticket, "")
        queue.redeemed = {s: t for s, t in queue.redeemed.items() if t >= now}
        queue.redeemed[serial] = turn + TICKET_GRACE_S
        return True

    def _ticket(self, address: str, serial: int, turn: float) -> str:
        text = f"{serial}.{round(turn * 1000)}"
        return f"{text}.{hmac.new(self.secret, f'{address}|{text}'.encode(), hashlib.sha256).hexdigest()[:32]}"

    def _refusal(self, address: str, wait: float, ticket: str, why: str) -> Refusal:
        told = f"{why}: " if why else ""
        return Refusal(429, "join_rate", f"too many joins from {address} ({told}{self.burst} at once, then "
                       f"{self.rate:g} per second); try again in {wait:.1f} s"
                       + (" with the ticket, which keeps this join's place" if ticket else ""),
                       headers={"Retry-After": str(max(1, math.ceil(wait)))},
                       body={"ticket": ticket} if ticket else None)

    def _make_room(self, now: float) -> None:
        if len(self.queues) < MAX_TRACKED_ADDRESSES:
            return
        idle = [a for a, q in self.queues.items() if q.due <= now and not q.redeemed]
        for address in idle or list(self.queues)[: len(self.queues) // 2]:
            del self.queues[address]


class Admission:
    """Joins (the join code, address bans, the cap of live peers per address, the join rate) and who a request
    is from (a peer's token, its ban), for ``Relay.join`` and ``Relay.peer``."""

    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self.joins = JoinLimiter(context.options.join_rate, context.options.join_burst)

    def join(self, address: str, *, agent: str = "", join_code: str = "", ticket: str = "") -> tuple[str, str]:
        """A new peer's id and token. Refused with the join code missing or wrong (403 ``join_code``), from the
        address of a banned peer (403 ``banned``), past the address's join rate (429 with ``Retry-After`` and a
        ticket that keeps the join's place: ``JoinLimiter``) or its cap of live peers (429, ``Retry-After``)."""
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
        self.joins.admit(address, ticket=ticket)
        credentials = store.add_peer(agent, address)
        if options.min_peers > 1:  # (a join may open the start gate for those held; otherwise it opens no work)
            self.context.notices.work_changed()
        else:
            self.context.notices.changed()
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
