"""Buffered asynchronous mode (``serve --mode async --buffer K``): a mixin of ``Relay``.

Peers never wait for a round: each gets the next unit of the plan's schedule at once, with the newest weights
version, and its result says the version it started from (the result's ``round``). A result is checked like
a round's (lease, wire, example count, update norm against the weights it started from) and kept in SQLite
with ``result - w_v``; every K accepted results the relay merges the oldest K, each weighted by
``(1 + s) ** -a`` for its staleness s (``server.session.buffered``), checkpoints the new version, and validates
every ``--validate-every`` merges. A result more than ``--max-staleness`` versions old is refused
(``409 too_stale``). The mode and its settings belong to the session (``SessionConfig``: a restart keeps
them). Leases use round -1 and the schedule entry as their slot.

Crash safety: a merge marks its results in SQLite before its checkpoint is written; on start, results marked
for a merge the checkpoint does not hold go back to the buffer, so a SIGKILL loses nothing and merges nothing
twice. Host replays, redundancy and backups are synchronous-mode features; ``serve`` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime import wire
from runtime.tasks import UnitResult
from server.relay.checks import check_update_norm, read_result
from server.relay.refusal import Refusal
from server.relay.sqlite_store import Store, StoredResult
from server.session.buffered import (
    effective_weights,
    entry_assignment,
    update_from,
    validates,
)

if TYPE_CHECKING:
    from server.session.package import Package
    from server.session.session import Session

ASYNC_ROUND = -1  # the leases table's round for the asynchronous stream of units
NORMS_KEPT = 50  # accepted update norms the relative outlier check compares with


class BufferedMerges:
    """Needs from the relay: ``session``, ``package``, ``store``, ``options``, ``_refused_on_slot``, ``changed``
    and ``work_changed``."""

    session: Session
    package: Package
    store: Store
    options: Any
    _refused_on_slot: dict[tuple[int, int], set[str]]

    if TYPE_CHECKING:
        def changed(self) -> None: ...

        def work_changed(self) -> None: ...

        def note_unit(self, peer_id: str, seconds: float, engine: str) -> None: ...

    @property
    def async_mode(self) -> bool:
        return self.session.config.mode == "async"

    def _async_state(self) -> dict[str, Any]:
        state = self.__dict__.setdefault("_async", {"versions": {}, "granted": {}, "norms": [], "next": 0})
        return state  # type: ignore[no-any-return]

    def start_async(self) -> None:
        """On start: results marked for merges the checkpoint lacks go back to the buffer; keep the weights."""
        if not self.async_mode:
            return
        returned = self.store.unmerge_from(self.session.round)
        if returned:
            self.store.count("arrivals_returned_to_buffer_on_start", returned)
        self.keep_version()

    def keep_version(self) -> None:
        """Remember the current weights (results started from them are judged against them) and forget
        versions past the staleness bound."""
        state, version = self._async_state(), self.session.round
        state["versions"][version] = self.session.weights.copy()
        for old in [v for v in state["versions"] if v < version - self.max_staleness]:
            state["versions"].pop(old)

    @property
    def max_staleness(self) -> int:
        return self.session.config.max_staleness

    @property
    def staleness_exponent(self) -> float:
        return self.session.config.staleness_exponent

    # -- handing out ---------------------------------------------------------------------------------
    def next_async(self, peer_id: str, job_json: Callable[[Any, float], dict[str, Any]]) -> dict[str, Any]:
        session, state, now = self.session, self._async_state(), self.store.clock()
        schedule = session.plan.schedule
        leases, done = self.store.leases(ASYNC_ROUND), self.store.arrived_entries()
        for entry, held in leases.items():  # the unit this peer is training
            if held.peer_id == peer_id and held.deadline >= now and entry in state["granted"] and entry not in done:
                return job_json(entry_assignment(schedule, session.plan.seed, entry, state["granted"][entry]),
                                held.deadline)
        while state["next"] < len(schedule) and state["next"] in done:
            state["next"] += 1
        for entry in range(state["next"], len(schedule)):
            lease = leases.get(entry)
            if entry in done or (lease is not None and lease.deadline >= now) or \
                    peer_id in self._refused_on_slot.get((ASYNC_ROUND, entry), ()):
                continue
            if lease is not None:
                self.store.count("leases_expired")
            granted = self.store.grant(ASYNC_ROUND, entry, schedule[entry][1], peer_id, self.options.lease_seconds)
            state["granted"][entry] = session.round
            self.changed()
            return job_json(entry_assignment(schedule, session.plan.seed, entry, session.round), granted.deadline)
        return {"wait": self.options.retry_seconds, "reason": "every unit is out; waiting for results"}

    # -- results ---------------------------------------------------------------------------------------
    def accept_async(self, peer_id: str, version: int, entry: int, body: bytes) -> StoredResult:
        session, state, now = self.session, self._async_state(), self.store.clock()
        schedule = session.plan.schedule
        if session.done:
            raise Refusal(409, "stale_round", "the session is over")
        if not 0 <= entry < len(schedule):
            raise Refusal(404, "unknown_slot", f"the session has no unit entry {entry}")
        if entry in self.store.arrived_entries():
            raise Refusal(409, "duplicate", f"unit entry {entry} already has a result")
        lease = self.store.leases(ASYNC_ROUND).get(entry)
        if lease is None or lease.peer_id != peer_id or state["granted"].get(entry) != version:
            raise Refusal(403, "not_leased", f"unit entry {entry} from version {version} is not leased to this peer")
        if lease.deadline < now:
            raise Refusal(409, "late", f"the lease on unit entry {entry} expired {now - lease.deadline:.1f} s ago")
        base = state["versions"].get(version)
        if base is None and version == session.round:  # (a merge is storing this version right now)
            base = session.weights
        if base is None or session.round - version > self.max_staleness:
            raise Refusal(409, "too_stale", f"the result started from version {version}, {session.round - version} "
                          f"behind the current {session.round} (at most {self.max_staleness})")
        assignment = entry_assignment(schedule, session.plan.seed, entry, version)
        try:
            header, vector, count, _ = read_result(body, session=session, fingerprint=self.package.fingerprint,
                                                   round_index=version, unit=session.work_unit(assignment))
            update = update_from(vector, base)
            norm = float(np.linalg.norm(update.astype(np.float64)))
            check_update_norm(norm, state["norms"], max_norm=self.options.max_update_norm,
                              outlier_factor=self.options.outlier_factor, min_results=self.options.outlier_min_results)
        except Refusal:
            self.store.release(ASYNC_ROUND, entry)
            self._refused_on_slot.setdefault((ASYNC_ROUND, entry), set()).add(peer_id)
            self.store.count("slots_freed_by_refusal")
            self.work_changed()
            raise
        state["norms"] = (state["norms"] + [norm])[-NORMS_KEPT:]
        self.note_unit(peer_id, now - lease.issued, str(header.meta.get("engine", "")))
        self.store.add_arrival(entry=entry, unit_index=assignment.unit_index, peer_id=peer_id, version=version,
                               num_examples=count, metrics=dict(header.metrics), message=body,
                               update=update.tobytes())
        return StoredResult(version, entry, assignment.unit_index, peer_id, count, dict(header.metrics), b"")

    def async_ready(self) -> bool:
        """K results wait, or the last ones of the session do."""
        if self.session.done:
            return False
        waiting = self.store.buffered_count()  # (on every poll: a count, not the updates)
        everything_back = len(self.store.arrived_entries()) >= len(self.session.plan.schedule)
        return waiting >= self.session.plan.participants_per_round or (everything_back and waiting > 0)

    def complete_buffer_blocking(self) -> dict[str, Any]:
        """Merge the oldest K buffered results into the next version (runs in a worker thread)."""
        session, k = self.session, self.session.plan.participants_per_round
        merge = session.round
        rows = self.store.buffered()[:k]
        buffer = []
        for _, _, unit, version, examples, metrics, update in rows:
            vector = np.frombuffer(update, dtype=np.float32)
            buffer.append((unit, UnitResult(effective_weights(session.weights, vector, merge - version,
                                                              self.staleness_exponent), examples, metrics)))
        self.store.mark_merged([row[0] for row in rows], merge)  # before the checkpoint (module docstring)
        every = session.config.validate_every
        entry = session.complete_buffer(buffer, validate=validates(merge, every, session.num_rounds), extra={
            "staleness": [merge - row[3] for row in rows], "started_from": [row[3] for row in rows],
            "entries": [row[1] for row in rows], "staleness_exponent": self.staleness_exponent})
        self.keep_version()
        return entry

    def async_progress(self) -> dict[str, int]:
        """The status's ``round_progress`` in async mode: results waiting in the buffer out of K."""
        now = self.store.clock()
        return {"slots": self.session.plan.participants_per_round, "done": self.store.buffered_count(),
                "leased": sum(1 for lease in self.store.leases(ASYNC_ROUND).values() if lease.deadline >= now),
                "copies": 0, "arrived": len(self.store.arrived_entries()), "units": len(self.session.plan.schedule)}

    def weights_of_version(self, version: int) -> bytes | None:
        """The wire message of a kept version (a peer asks for the weights its job names)."""
        weights = self._async_state()["versions"].get(version)
        if weights is None:
            return None
        header = wire.WireHeader(spec=self.session.spec, round=version, fingerprint=self.package.fingerprint,
                                 num_examples=0)
        return wire.encode(weights, header)
