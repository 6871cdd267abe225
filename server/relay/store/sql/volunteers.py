"""Volunteers: the people behind peers. A page proves a key it keeps when it joins (``server.relay.volunteers``);
the key's digest is the volunteer, and every peer it joins (each worker, each reload, each new tab) is one more peer
of the same volunteer. A volunteer may give a display name and a team. Credit is read from the results and the
arrivals of its peers (``server.relay.credit``)."""

from __future__ import annotations

from typing import Any

from server.relay.store.sql.database import TablePart

# (round, slot, unit index, peer, volunteer ('' without a key), examples, verification, received, banned)
RESULT_ROWS = ("SELECT r.round, r.slot, r.unit_index, r.peer_id, p.volunteer, r.num_examples, r.verification, "
               "r.received, b.peer_id IS NOT NULL FROM results r LEFT JOIN peers p ON p.id = r.peer_id "
               "LEFT JOIN bans b ON b.peer_id = r.peer_id")
# (merge, unit index, peer, volunteer, examples, received, banned) of the asynchronous buffer's merged arrivals
ARRIVAL_ROWS = ("SELECT a.merge, a.unit_index, a.peer_id, p.volunteer, a.num_examples, a.received, "
                "b.peer_id IS NOT NULL FROM arrivals a LEFT JOIN peers p ON p.id = a.peer_id "
                "LEFT JOIN bans b ON b.peer_id = a.peer_id WHERE a.merge IS NOT NULL")


class SQLVolunteers(TablePart):
    """``server.relay.store.concepts.VolunteerStore`` on the ``volunteers`` table and ``peers.volunteer``."""

    def attach_volunteer(self, peer_id: str, volunteer_id: str, public_key: str, *, name: str | None = None,
                         team: str | None = None) -> None:
        now = self.clock()
        with self.connection.transaction() as db:
            db.execute("INSERT INTO volunteers (id, public_key, name, team, created, last_joined) "
                       "VALUES (?, ?, '', '', ?, ?) ON CONFLICT (id) DO UPDATE SET last_joined = excluded.last_joined",
                       (volunteer_id, public_key, now, now))
            if name is not None or team is not None:
                self._profile(db, volunteer_id, name, team)
            db.execute("UPDATE peers SET volunteer = ? WHERE id = ?", (volunteer_id, peer_id))

    def set_profile(self, volunteer_id: str, *, name: str | None, team: str | None) -> None:
        with self.connection.transaction() as db:
            self._profile(db, volunteer_id, name, team)

    @staticmethod
    def _profile(db: Any, volunteer_id: str, name: str | None, team: str | None) -> None:
        if name is not None:
            db.execute("UPDATE volunteers SET name = ? WHERE id = ?", (name, volunteer_id))
        if team is not None:
            db.execute("UPDATE volunteers SET team = ? WHERE id = ?", (team, volunteer_id))

    def volunteer_of(self, peer_id: str) -> str:
        rows = self.connection.run("SELECT volunteer FROM peers WHERE id = ?", (peer_id,))
        return str(rows[0][0]) if rows else ""

    def identity(self, peer_id: str) -> str:
        return self.volunteer_of(peer_id) or peer_id

    def volunteer_peers(self, volunteer_id: str) -> list[str]:
        rows = self.connection.run("SELECT id FROM peers WHERE volunteer = ? ORDER BY joined", (volunteer_id,))
        return [str(r[0]) for r in rows]

    def volunteer_banned(self, volunteer_id: str) -> str | None:
        rows = self.connection.run("SELECT b.reason FROM bans b JOIN peers p ON p.id = b.peer_id WHERE "
                                   "p.volunteer = ? LIMIT 1", (volunteer_id,))
        return str(rows[0][0]) if rows else None

    def volunteers(self) -> dict[str, dict[str, Any]]:
        rows = self.connection.run("SELECT id, name, team, created, last_joined FROM volunteers")
        return {r[0]: {"name": r[1], "team": r[2], "created": r[3], "last_joined": r[4]} for r in rows}

    def credit_rows(self) -> tuple[list[tuple], list[tuple]]:
        """Every result's and every merged arrival's row for credit (``RESULT_ROWS``, ``ARRIVAL_ROWS``)."""
        with self.connection.locked() as db:
            return [tuple(r) for r in db.execute(RESULT_ROWS).fetchall()], \
                [tuple(r) for r in db.execute(ARRIVAL_ROWS).fetchall()]


class VolunteerCalls:
    """``SQLStore``'s volunteer calls, handed to its ``SQLVolunteers`` part, with who each peer is kept in memory
    (a peer's volunteer is fixed once it joined)."""

    _volunteers: SQLVolunteers
    _identities: dict[str, str]  # peer -> its volunteer, or itself where it proved no key

    def attach_volunteer(self, peer_id: str, volunteer_id: str, public_key: str, *, name: str | None = None,
                         team: str | None = None) -> None:
        self._volunteers.attach_volunteer(peer_id, volunteer_id, public_key, name=name, team=team)
        self._identities[peer_id] = volunteer_id

    def set_profile(self, volunteer_id: str, *, name: str | None, team: str | None) -> None:
        self._volunteers.set_profile(volunteer_id, name=name, team=team)

    def volunteer_of(self, peer_id: str) -> str:
        return self._volunteers.volunteer_of(peer_id)

    def identity(self, peer_id: str) -> str:
        known = self._identities.get(peer_id)
        if known is None:
            known = self._identities[peer_id] = self._volunteers.identity(peer_id)
        return known

    def volunteer_peers(self, volunteer_id: str) -> list[str]:
        return self._volunteers.volunteer_peers(volunteer_id)

    def volunteer_banned(self, volunteer_id: str) -> str | None:
        return self._volunteers.volunteer_banned(volunteer_id)

    def volunteers(self) -> dict[str, dict[str, Any]]:
        return self._volunteers.volunteers()

    def credit_rows(self) -> tuple[list[tuple], list[tuple]]:
        return self._volunteers.credit_rows()
