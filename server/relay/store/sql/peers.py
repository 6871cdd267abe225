"""Peers: who joined (id, hashed token, address, agent), when each was last seen, units done."""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

from server.relay.store.concepts import LAST_SEEN_RESOLUTION
from server.relay.store.records import hash_token
from server.relay.store.sql.database import TablePart

KNOWN_PEERS = 100_000  # peers whose token hash and address are kept at most (past it all are forgotten: read again)


@dataclass(frozen=True)
class SQLPeers(TablePart):
    """``server.relay.store.concepts.PeerStore`` on the ``peers`` table (and ``leases``, ``bans`` for who counts
    as active). ``known``: each peer authenticated so far, (its token's hash, when this relay last wrote it seen)."""

    known: dict[str, tuple[str, float]] = field(default_factory=dict, repr=False)
    address_of: dict[str, str] = field(default_factory=dict, repr=False)  # (each peer's, as read: it never changes)

    def add_peer(self, agent: str = "", address: str = "") -> tuple[str, str]:
        peer_id, token = "p-" + secrets.token_hex(4), secrets.token_urlsafe(24)
        now = self.clock()
        self.connection.run("INSERT INTO peers (id, token_hash, joined, last_seen, agent, address) "
                            "VALUES (?, ?, ?, ?, ?, ?)", (peer_id, hash_token(token), now, now, agent[:200],
                                                          address[:100]))
        self._keep(self.address_of)[peer_id] = address[:100]
        return peer_id, token

    def authenticate(self, peer_id: str, token: str, *, touch: bool = True) -> bool:
        """Whether ``token`` is ``peer_id``'s. A token's hash never changes once its peer joined, so it is read from
        the store once and kept (``known``); the store is written only to move ``last_seen`` on, at most once per
        ``LAST_SEEN_RESOLUTION`` (every request of a crowd asks: a read under the store's lock each time was 7 % of
        the event loop's time at a thousand peers, most of it waiting for that lock)."""
        known = self.known.get(peer_id)
        if known is None:
            rows = self.connection.run("SELECT token_hash, last_seen FROM peers WHERE id = ?", (peer_id,))
            if not rows:  # (as long as a known peer's check)
                hmac.compare_digest(hash_token(secrets.token_hex(8)), hash_token(token))
                return False
            known = self._keep(self.known)[peer_id] = (str(rows[0][0]), float(rows[0][1]))
        ok = hmac.compare_digest(known[0], hash_token(token))
        now = self.clock()
        if ok and touch and not now - known[1] < LAST_SEEN_RESOLUTION:
            self.connection.change("UPDATE peers SET last_seen = ? WHERE id = ?", (now, peer_id))
            self.known[peer_id] = known[0], now
        return ok

    def depart(self, peer_id: str) -> None:
        self.connection.run("UPDATE peers SET last_seen = 0 WHERE id = ?", (peer_id,))
        if (known := self.known.get(peer_id)) is not None:
            self.known[peer_id] = known[0], 0.0  # (its next request marks it seen again)

    def active_peers(self, within_seconds: float) -> list[str]:
        now = self.clock()
        rows = self.connection.run("SELECT id FROM peers WHERE last_seen >= ? UNION "
                                   "SELECT peer_id FROM leases WHERE deadline >= ? EXCEPT SELECT peer_id FROM bans",
                                   (now - within_seconds, now))
        return sorted(r[0] for r in rows)

    def live_peers_at(self, address: str, within_seconds: float) -> int:
        since = self.clock() - within_seconds
        return int(self.connection.run("SELECT COUNT(*) FROM peers WHERE address = ? AND last_seen >= ?",
                                       (address, since))[0][0])

    def addresses(self, within_seconds: float) -> int:
        since = self.clock() - within_seconds
        return int(self.connection.run("SELECT COUNT(DISTINCT address) FROM peers WHERE last_seen >= ?",
                                       (since,))[0][0])

    def peer_count(self) -> int:
        return int(self.connection.run("SELECT COUNT(*) FROM peers")[0][0])

    def peer_address(self, peer_id: str) -> str:
        """(Kept once read: every accepted result and copy candidate asks.)"""
        if (address := self.address_of.get(peer_id)) is not None:
            return address
        rows = self.connection.run("SELECT address FROM peers WHERE id = ?", (peer_id,))
        if not rows:
            return ""
        address = self._keep(self.address_of)[peer_id] = str(rows[0][0])
        return address

    @staticmethod
    def _keep[V](kept: dict[str, V]) -> dict[str, V]:
        """``kept``, emptied first when it holds ``KNOWN_PEERS`` (a session open for months meets millions of
        peers: what is kept of them stays bounded, and a peer forgotten is read again)."""
        if len(kept) >= KNOWN_PEERS:
            kept.clear()
        return kept

    def peers_listing(self) -> list[dict[str, Any]]:
        return self._listing("ORDER BY p.joined", ())

    def recent_peers(self, limit: int) -> list[dict[str, Any]]:
        return self._listing("ORDER BY p.last_seen DESC, p.joined, p.id LIMIT ?", (max(0, int(limit)),))

    def _listing(self, order: str, parameters: tuple[Any, ...]) -> list[dict[str, Any]]:
        rows = self.connection.run("SELECT p.id, p.address, p.agent, p.joined, p.last_seen, p.units_done, b.reason, "
                                   f"b.time FROM peers p LEFT JOIN bans b ON b.peer_id = p.id {order}", parameters)
        return [{"peer_id": r[0], "address": r[1], "agent": r[2], "joined": r[3], "last_seen": r[4],
                 "units_done": r[5], "banned": r[6] is not None, "ban_reason": r[6], "banned_at": r[7]}
                for r in rows]
