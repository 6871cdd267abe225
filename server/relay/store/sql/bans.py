"""Bans: a banned peer (and, through it, the address it joined from), why and when."""

from __future__ import annotations

from server.relay.store.sql.database import TablePart


class SQLBans(TablePart):
    """``server.relay.store.concepts.BanStore`` on the ``bans`` table."""

    def ban(self, peer_id: str, reason: str) -> str:
        with self.connection.locked() as db:
            rows = db.execute("SELECT address FROM peers WHERE id = ?", (peer_id,)).fetchall()
            address = rows[0][0] if rows else ""
            db.execute("INSERT INTO bans VALUES (?, ?, ?, ?) ON CONFLICT (peer_id) DO UPDATE SET address = "
                       "excluded.address, reason = excluded.reason, time = excluded.time",
                       (peer_id, address, reason[:500], self.clock()))
            return str(address)

    def unban(self, peer_id: str) -> bool:
        return self.connection.change("DELETE FROM bans WHERE peer_id = ?", (peer_id,)) > 0

    def reasons(self) -> dict[str, str]:
        """Every banned peer's reason."""
        return {str(peer): str(reason) for peer, reason in self.connection.run("SELECT peer_id, reason FROM bans")}

    def ban_reason(self, peer_id: str) -> str | None:
        rows = self.connection.run("SELECT reason FROM bans WHERE peer_id = ?", (peer_id,))
        return str(rows[0][0]) if rows else None

    def address_banned(self, address: str) -> bool:
        return bool(address) and bool(self.connection.run("SELECT 1 FROM bans WHERE address = ? LIMIT 1", (address,)))
