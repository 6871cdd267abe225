"""Backups of stragglers (``serve --backup-after F``, a part of the relay; ``UnitCopies`` hands them out as second
copies): MapReduce's speculative execution. Once every unit of the round is out, an idle peer gets a copy of the unit
in flight longest, when it has been out for ``F`` times the session's median unit time (default 1; 0: at once), never
the peer holding it (nor, in a local task, a volunteer whose files the round counted: ``server.relay.local_turns``).
The first result that passes the checks is merged."""

from __future__ import annotations

import statistics
from collections import deque

from runtime.planner import Assignment
from server.relay.book import RoundBook
from server.relay.context import Part, RelayContext
from server.relay.local_turns import LocalTurns
from server.relay.store import Lease

UNIT_TIMES_KEPT = 50  # merged units whose hand-out-to-result time sets the backups' yardstick


class Backups(Part):
    """The backups' yardstick (the last merged units' times), who gets a backup, and which units had one."""

    def __init__(self, context: RelayContext, book: RoundBook) -> None:
        self.context, self.book = context, book
        self.local = LocalTurns(context)  # (a local unit's backup goes to a volunteer whose files it has not counted)
        # Hand-out to result of the session's last merged units: the backups' yardstick.
        self._unit_seconds: deque[float] = deque(maxlen=UNIT_TIMES_KEPT)
        self._backups: dict[int, dict[str, list[int]]] = {}  # round -> units that got a backup, those that won

    def backup_after_seconds(self) -> float | None:
        """How long a unit must have been in flight before it gets a backup: ``backup_after`` times the median
        time a unit of this session took (hand-out to result); None: no backups (off, or no unit back yet)."""
        factor = self.options.backup_after
        if factor is None or factor < 0:
            return None
        if factor == 0:
            return 0.0
        return factor * statistics.median(self._unit_seconds) if self._unit_seconds else None

    def next_backup_in(self) -> float | None:
        """Seconds until a unit in flight crosses the backup threshold (a held request wakes then), or None."""
        after = self.backup_after_seconds()
        if after is None or self.session.done or self.session.config.mode == "async":
            return None
        round_index, now = self.session.round, self.store.clock()
        done, copy_leases = self.store.result_slots(round_index), self.store.leases(round_index, 1)
        waits = [lease.issued + after - now for slot, lease in self.store.leases(round_index).items()
                 if slot not in done and lease.deadline >= now
                 and (slot not in copy_leases or copy_leases[slot].deadline < now)]
        return max(0.05, min(waits)) if waits else None

    def next_backup(self, peer_id: str, copy_leases: dict[int, Lease], now: float) -> tuple[Assignment, float] | None:
        """A backup lease for ``peer_id`` on the unit in flight longest past the threshold: its assignment and the
        lease's deadline, or None. ``copy_leases``: the round's second-copy leases."""
        after = self.backup_after_seconds()
        if after is None:
            return None
        round_index = self.session.round
        done = self.store.result_slots(round_index)
        candidates = [lease for slot, lease in self.store.leases(round_index).items()
                      if slot not in done and lease.deadline >= now and lease.peer_id != peer_id
                      and now - lease.issued >= after and not self.book.refused(round_index, slot, peer_id)
                      and (slot not in copy_leases or copy_leases[slot].deadline < now)]
        if not candidates or not self.local.may_back_up(peer_id, round_index, now):
            return None
        oldest = min(candidates, key=lambda lease: lease.issued)
        assignment = {a.slot: a for a in self.session.assignments()}[oldest.slot]
        granted = self.store.grant(round_index, oldest.slot, oldest.unit_index, peer_id, self.options.lease_seconds,
                                   copy=1)
        if granted is None:  # (another relay over the store leased it a moment ago)
            return None
        self.store.count("backups_handed_out")
        self._backups.setdefault(round_index, {"units": [], "won": []})["units"].append(oldest.unit_index)
        return assignment, granted.deadline

    def record_unit_time(self, round_index: int, slot: int, lease: Lease, *, backup_won: bool) -> None:
        """A merged result came: how long its unit took (the backups' yardstick), and whether a backup won."""
        self._unit_seconds.append(max(0.0, self.store.clock() - lease.issued))
        if backup_won:
            self.store.count("backups_won")
            unit = {a.slot: a for a in self.session.assignments()}[slot].unit_index
            self._backups.setdefault(round_index, {"units": [], "won": []})["won"].append(unit)

    def summary(self, round_index: int) -> dict[str, list[int]] | None:
        """The history's ``backups`` entry: the units that got a backup, and those whose backup was merged."""
        return self._backups.pop(round_index, None)
