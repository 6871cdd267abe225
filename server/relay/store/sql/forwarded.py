"""Results a replica of a synchronous session handed to the relay holding it, and that relay's verdicts
(``server.relay.store.concepts.ForwardStore``; ``server.relay.sharing`` hands them over and judges them)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any

from server.relay.store.records import ForwardedResult
from server.relay.store.sql.database import TablePart

MAX_IDS = 500  # results whose verdicts one statement asks for, at most (the rest: the next look)


class SQLForwarded(TablePart):
    """The ``forwarded`` table: a row per result handed over, its verdict NULL until judged; the replica's read of
    the verdict deletes the row."""

    def forward_result(self, round_index: int, slot: int, peer_id: str, message: bytes) -> int:
        rows = self.connection.run("INSERT INTO forwarded (round, slot, peer_id, message, received) "
                                   "VALUES (?, ?, ?, ?, ?) RETURNING id",
                                   (round_index, slot, peer_id, message, self.clock()))
        return int(rows[0][0])

    def forwarded(self, limit: int) -> list[ForwardedResult]:
        rows = self.connection.run("SELECT id, round, slot, peer_id, message FROM forwarded WHERE verdict IS NULL "
                                   "ORDER BY id LIMIT ?", (limit,))
        return [ForwardedResult(int(i), int(r), int(s), str(p), bytes(m)) for i, r, s, p, m in rows]

    def settle_forwarded(self, forward_id: int, verdict: dict[str, Any]) -> None:
        self.connection.run("UPDATE forwarded SET verdict = ?, message = ? WHERE id = ?",
                            (json.dumps(verdict), b"", forward_id))

    def take_verdicts(self, forward_ids: Collection[int]) -> dict[int, dict[str, Any]]:
        ids = list(forward_ids)[:MAX_IDS]
        if not ids:
            return {}
        rows = self.connection.run(f"DELETE FROM forwarded WHERE id IN ({', '.join('?' * len(ids))}) AND verdict IS "
                                   "NOT NULL RETURNING id, verdict", ids)
        return {int(row[0]): dict(json.loads(row[1])) for row in rows}

    def withdraw_forwarded(self, forward_id: int) -> bool:
        return self.connection.change("DELETE FROM forwarded WHERE id = ? AND verdict IS NULL", (forward_id,)) > 0

    def prune_forwarded_before(self, round_index: int) -> int:
        """Rows of rounds before ``round_index`` (a replica that stopped before it read its verdict left them)."""
        return self.connection.change("DELETE FROM forwarded WHERE round < ?", (round_index,))


class ForwardCalls:
    """``SQLStore``'s calls on results handed over, handed to its ``SQLForwarded`` part."""

    _forwarded: SQLForwarded
    _changing_leases: Callable[[], AbstractContextManager[None]]  # (``KeptViews``'s)

    def forward_result(self, round_index: int, slot: int, peer_id: str, message: bytes) -> int:
        return self._forwarded.forward_result(round_index, slot, peer_id, message)

    def forwarded(self, limit: int) -> list[ForwardedResult]:
        return self._forwarded.forwarded(limit)

    def settle_forwarded(self, forward_id: int, verdict: dict[str, Any]) -> None:
        self._forwarded.settle_forwarded(forward_id, verdict)

    def take_verdicts(self, forward_ids: Collection[int]) -> dict[int, dict[str, Any]]:
        verdicts = self._forwarded.take_verdicts(forward_ids)
        if verdicts:  # (the holder kept the results, or freed their leases: what is kept is read afresh)
            with self._changing_leases():
                pass
        return verdicts

    def withdraw_forwarded(self, forward_id: int) -> bool:
        return self._forwarded.withdraw_forwarded(forward_id)
