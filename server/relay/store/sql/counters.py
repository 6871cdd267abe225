"""Counters: events by name (refusals by reason, bytes sent, leases expired, ...)."""

from __future__ import annotations

from server.relay.store.sql.database import TablePart


class SQLCounters(TablePart):
    """``server.relay.store.concepts.CounterStore`` on the ``counters`` table."""

    def count(self, name: str, by: int = 1) -> None:
        self.connection.run("INSERT INTO counters VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET "
                            "value = counters.value + ?", (name, by, by))

    def counters(self) -> dict[str, int]:
        return {name: int(value) for name, value in self.connection.run("SELECT name, value FROM counters ORDER BY "
                                                                         "name")}
