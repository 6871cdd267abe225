"""``SQLStore``: the relay's store on a SQL database, whichever: SQLite (``server.relay.store.sqlite``, one file
beside the session's checkpoints) or PostgreSQL (``server.relay.store.postgresql``, a server several relays share).

It owns one database connection and a part per concept (peers, leases, results, copies, arrivals, bans, undos,
counters), each in its own module over the same connection, and answers the flat ``Store`` protocol by handing each
call to the part that owns it. The contract of every method is on the protocol (``server.relay.store.protocol``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from server.relay.store.concepts import LAST_SEEN_RESOLUTION
from server.relay.store.records import (
    ASYNC_ROUND,
    FinishedReplay,
    Lease,
    PendingUndo,
    ReplayJob,
    StoredResult,
)
from server.relay.store.sql.arrivals import ArrivalCalls, SQLArrivals
from server.relay.store.sql.bans import SQLBans
from server.relay.store.sql.copies import SQLCopies
from server.relay.store.sql.counters import SQLCounters
from server.relay.store.sql.database import Database
from server.relay.store.sql.forwarded import ForwardCalls, SQLForwarded
from server.relay.store.sql.leases import SQLLeases
from server.relay.store.sql.pause import SQLPause
from server.relay.store.sql.peers import SQLPeers
from server.relay.store.sql.refusals import RefusalCalls, SQLRefusals
from server.relay.store.sql.replay_jobs import SQLReplayJobs
from server.relay.store.sql.results import SQLResults
from server.relay.store.sql.undos import SQLUndos
from server.relay.store.sql.views import CACHE_ROUNDS, KeptViews
from server.relay.store.sql.volunteers import SQLVolunteers, VolunteerCalls


class SQLStore(KeptViews, VolunteerCalls, RefusalCalls, ForwardCalls, ArrivalCalls):
    """The relay's store on ``database`` (opened here), safe to share between threads; what it keeps of the rows it
    read, and when it forgets them: ``server.relay.store.sql.views``."""

    def __init__(self, database: Database, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.connection = database
        self._peers = SQLPeers(self.connection, clock)
        self._leases = SQLLeases(self.connection, clock)
        self._results = SQLResults(self.connection, clock)
        self._copies = SQLCopies(self.connection, clock)
        self._arrivals = SQLArrivals(self.connection, clock)
        self._bans = SQLBans(self.connection, clock)
        self._undos = SQLUndos(self.connection, clock)
        self._counters = SQLCounters(self.connection, clock)
        self._replays = SQLReplayJobs(self.connection, clock)
        self._volunteers = SQLVolunteers(self.connection, clock)
        self._pauses = SQLPause(self.connection, clock)
        self._forwarded = SQLForwarded(self.connection, clock)
        self._refusals = SQLRefusals(self.connection, clock)
        self._identities = {}
        KeptViews.__init__(self, clock, forget=self._arrivals.forget)
        self.open()

    # -- opening and closing ------------------------------------------------------------------------
    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @property
    def path(self) -> Path | None:
        return self.connection.path

    @property
    def location(self) -> str:
        return self.connection.location

    @property
    def closed(self) -> bool:
        return self.connection.closed

    def open(self) -> None:
        with self._changing_leases():  # (the file may have changed while it was closed)
            self._arrivals.forget()
            self._pause, self._bans_cache, self._undos_cache = None, None, None
            self.connection.open()

    def close(self) -> None:
        with self._changing_leases():
            self._arrivals.forget()
            self.connection.close()

    def disk_bytes(self) -> int:
        return self.connection.disk_bytes()

    # -- peers --------------------------------------------------------------------------------------
    def add_peer(self, agent: str = "", address: str = "") -> tuple[str, str]:
        self._forget_active()
        return self._peers.add_peer(agent, address)

    def authenticate(self, peer_id: str, token: str, *, touch: bool = True) -> bool:
        ok = self._peers.authenticate(peer_id, token, touch=touch)
        if ok and touch:
            self._forget_active(unless=peer_id)  # (a peer back after a while is active again)
        return ok

    def depart(self, peer_id: str) -> None:
        self._forget_active()
        self._peers.depart(peer_id)

    # Every request for work asks who is active (may a copy wait for someone, is a slot refused by everyone here):
    # at a thousand peers that query read the peers, the leases and the bans a thousand times a round, 40 % of the
    # relay's event loop (py-spy, bench crowd at k = 100). The answer is kept for a tenth of the window asked about,
    # at most ``LAST_SEEN_RESOLUTION`` (the precision of last_seen itself), and forgotten when a peer joins, leaves,
    # comes back, is banned or unbanned, or the leases change (but a grant to a peer already active).
    def active_peers(self, within_seconds: float) -> list[str]:
        self._expire()
        now = self._clock()
        with self._cache_lock:
            kept = self._active
            if kept is not None and kept[1] == within_seconds and \
                    0 <= now - kept[0] < min(LAST_SEEN_RESOLUTION, within_seconds / 10):
                return list(kept[2])
            ids = self._peers.active_peers(within_seconds)
            self._active = (now, within_seconds, ids, frozenset(ids))
            return list(ids)

    def live_peers_at(self, address: str, within_seconds: float) -> int:
        return self._peers.live_peers_at(address, within_seconds)

    def addresses(self, within_seconds: float) -> int:
        return self._peers.addresses(within_seconds)

    def peer_count(self) -> int:
        return self._peers.peer_count()

    def peer_address(self, peer_id: str) -> str:
        return self._peers.peer_address(peer_id)

    def peers_listing(self) -> list[dict[str, Any]]:
        return self._peers.peers_listing()

    def recent_peers(self, limit: int) -> list[dict[str, Any]]:
        return self._peers.recent_peers(limit)

    # -- leases -------------------------------------------------------------------------------------
    # Kept as read (``views``): a grant updates them, any other change to the table forgets them.
    def leases(self, round_index: int, copy: int = 0) -> dict[int, Lease]:
        with self._cache_lock:
            return dict(self._lease_view(round_index, copy))

    def kept_lease(self, round_index: int, slot: int, copy: int = 0) -> Lease | None:
        with self._cache_lock:
            return self._lease_view(round_index, copy).get(slot)

    def _lease_view(self, round_index: int, copy: int) -> dict[int, Lease]:
        """The round's leases as kept (never handed out: ``leases`` copies it), read first where they are not."""
        self._expire()
        return self._kept_itself(self._lease_cache, (round_index, copy), lambda: self._leases.leases(round_index, copy))

    def lease(self, round_index: int, slot: int, copy: int = 0) -> Lease | None:
        return self._leases.lease(round_index, slot, copy)

    def grant(self, round_index: int, slot: int, unit_index: int, peer_id: str, seconds: float,
              copy: int = 0, *, version: int = 0) -> Lease | None:
        with self._cache_lock:
            lease = self._leases.grant(round_index, slot, unit_index, peer_id, seconds, copy, version=version)
            self._granted(lease, round_index, copy, peer_id)
            return lease

    def release(self, round_index: int, slot: int, peer_id: str | None = None) -> None:
        def going(key: tuple[int, int], view: dict[int, Lease]) -> list[int]:  # (the slot's lease, looked up)
            lease = view.get(slot) if key[0] == round_index else None
            return [slot] if lease is not None and (peer_id is None or lease.peer_id == peer_id) else []
        with self._releasing(going):
            self._leases.release(round_index, slot, peer_id)

    def swap_copies(self, round_index: int, slot: int) -> None:
        with self._changing_leases():
            self._leases.swap_copies(round_index, slot)

    def release_leases_of(self, peer_id: str) -> int:
        with self._releasing(live_leases_of(peer_id, self.clock())):
            return self._leases.release_leases_of(peer_id)

    def release_leases_on_leaving(self, peer_id: str) -> int:
        with self._releasing(live_leases_of(peer_id, self.clock())):
            return self._leases.release_leases_on_leaving(peer_id)

    def release_live_leases(self) -> int:
        with self._changing_leases():
            return self._leases.release_live_leases()

    # -- results ------------------------------------------------------------------------------------
    # The slots with a result are kept like the leases (every request for work and every poll of a round asks).
    def add_result(self, result: StoredResult, *, count_unit: bool = True) -> None:
        with self._changing_results():
            self._results.add_result(result, count_unit=count_unit)

    def result_slots(self, round_index: int) -> set[int]:
        return set(self._result_peers(round_index))

    def _result_peers(self, round_index: int) -> dict[int, str]:
        self._expire()
        with self._cache_lock:
            cached = self._slots_cache.get(round_index)
            if cached is None:
                if len(self._slots_cache) >= CACHE_ROUNDS:
                    self._slots_cache.clear()
                cached = self._slots_cache[round_index] = self._results.result_peers(round_index)
            return cached

    def result_peer(self, round_index: int, slot: int) -> str | None:
        return self._result_peers(round_index).get(slot)

    def has_result(self, round_index: int, slot: int) -> bool:
        return self._results.has_result(round_index, slot)

    def results(self, round_index: int) -> dict[int, StoredResult]:
        return self._results.results(round_index)

    def result(self, round_index: int, slot: int) -> StoredResult | None:
        return self._results.result(round_index, slot)

    def all_results(self) -> list[StoredResult]:
        return self._results.all_results()

    def replace_message(self, round_index: int, slot: int, message: bytes) -> None:
        self._results.replace_message(round_index, slot, message)

    def remove_result(self, round_index: int, slot: int) -> None:
        with self._changing_results():
            self._results.remove_result(round_index, slot)

    def remove_results_of(self, peer_id: str, round_index: int) -> list[int]:
        with self._changing_leases():  # (its leases of the round go too)
            return self._results.remove_results_of(peer_id, round_index)

    def reset_round(self, round_index: int) -> int:
        with self._changing_leases():  # (the round's leases go too)
            return self._results.reset_round(round_index)

    def set_verification(self, round_index: int, slot: int, peer_id: str, outcome: str) -> None:
        if round_index == ASYNC_ROUND:  # (an arrival of the asynchronous buffer: ``slot`` is its entry)
            self._arrivals.check_arrival(slot, peer_id, outcome)
        else:
            self._results.set_verification(round_index, slot, peer_id, outcome)

    def audit(self) -> list[dict[str, Any]]:
        return self._results.audit() + self._arrivals.audit_arrivals()

    def prune_before(self, round_index: int) -> int:
        self._forwarded.prune_forwarded_before(round_index)  # (verdicts a stopped replica never read)
        return self._results.prune_before(round_index)

    # -- second copies ------------------------------------------------------------------------------
    # Kept like the leases, for the same reason (each request for work asks whether a slot wants its copy): a round's
    # outcomes as read, forgotten on any change to them.
    def add_copy(self, round_index: int, slot: int, peer_id: str, message: bytes, outcome: str, *,
                 count_unit: bool = True, sha256: str | None = None) -> None:
        with self._changing_copies():
            self._copies.add_copy(round_index, slot, peer_id, message, outcome, count_unit=count_unit, sha256=sha256)

    def set_copy_outcome(self, round_index: int, slot: int, peer_id: str, outcome: str) -> None:
        with self._changing_copies():
            self._copies.set_copy_outcome(round_index, slot, peer_id, outcome)

    def copies(self, round_index: int) -> dict[tuple[int, str], str]:
        self._expire()
        return self._kept(self._copies_cache, round_index, lambda: self._copies.copies(round_index))

    def copy_message(self, round_index: int, slot: int, peer_id: str) -> bytes | None:
        return self._copies.copy_message(round_index, slot, peer_id)

    def confirmed_peers(self) -> set[str]:
        return self._copies.confirmed_peers()

    # -- bans ---------------------------------------------------------------------------------------
    # Every ban's reason is kept as read (asked for each candidate of each copy's hand-out); a ban or unban here
    # forgets it, as a shared store's views expire (another relay's ban).
    def ban(self, peer_id: str, reason: str) -> str:
        self._forget_active()
        with self._cache_lock:
            self._bans_cache = None
            return self._bans.ban(peer_id, reason)

    def unban(self, peer_id: str) -> bool:
        self._forget_active()
        with self._cache_lock:
            self._bans_cache = None
            return self._bans.unban(peer_id)

    def ban_reason(self, peer_id: str) -> str | None:
        self._expire()
        with self._cache_lock:
            if self._bans_cache is None:
                self._bans_cache = self._bans.reasons()
            return self._bans_cache.get(peer_id)

    def address_banned(self, address: str) -> bool:
        return self._bans.address_banned(address)

    # -- undos --------------------------------------------------------------------------------------
    # The undos not done are kept as read (every result's try to merge asks whether one waits: 2.8 reads an accepted
    # result); a request or a change here forgets them, as a shared store's views expire (another relay's ban).
    def request_undo(self, peer_id: str) -> None:
        with self._cache_lock:
            self._undos_cache = None
            self._undos.request_undo(peer_id)

    def undos(self) -> list[PendingUndo]:
        self._expire()
        with self._cache_lock:
            if self._undos_cache is None:
                self._undos_cache = self._undos.undos()
            return [(peer_id, state, copy.deepcopy(plan)) for peer_id, state, plan in self._undos_cache]

    def set_undo(self, peer_id: str, state: str, plan: dict[str, Any]) -> None:
        with self._cache_lock:
            self._undos_cache = None
            self._undos.set_undo(peer_id, state, plan)

    def unverified_rounds(self, peer_id: str) -> tuple[int | None, list[int]]:
        return self._undos.unverified_rounds(peer_id)

    def mark_undone(self, peer_id: str, first: int, end: int) -> int:
        return self._undos.mark_undone(peer_id, first, end)

    def undone_slots(self, round_index: int) -> set[int]:
        return self._undos.undone_slots(round_index)

    def pruned_rounds(self, first: int, end: int) -> set[int]:
        return self._undos.pruned_rounds(first, end)

    # -- replays for verification workers ---------------------------------------------------------------
    def add_replay_job(self, *, job: str, task: bytes, weights: bytes, unit: bytes, engine: str) -> int:
        return self._replays.add_replay_job(job=job, task=task, weights=weights, unit=unit, engine=engine)

    def blob(self, digest: str) -> bytes | None:
        return self._replays.blob(digest)

    def claim_replay_job(self, worker: str, seconds: float) -> ReplayJob | None:
        return self._replays.claim_replay_job(worker, seconds)

    def finish_replay_job(self, job_id: int, worker: str, result: FinishedReplay) -> bool:
        return self._replays.finish_replay_job(job_id, worker, result)

    def finished_replay_jobs(self, job_ids: Collection[int]) -> dict[int, FinishedReplay]:
        return self._replays.finished_replay_jobs(job_ids)

    def forget_replay_jobs(self, job_ids: Collection[int] | None) -> None:
        self._replays.forget_replay_jobs(job_ids)

    def replay_jobs_waiting(self) -> int:
        return self._replays.replay_jobs_waiting()

    # -- the host's pause: read on every request for work, so kept as read (a shared store's for a moment) --------
    def set_pause(self, paused: bool, pause_from: int | None) -> None:
        with self._cache_lock:
            self._pauses.set_pause(paused, pause_from)
            self._pause = paused, pause_from
            self._generation += 1

    def pause(self) -> tuple[bool, int | None]:
        self._expire()
        with self._cache_lock:
            if self._pause is None:
                self._pause = self._pauses.pause()
            return self._pause

    # -- counters -----------------------------------------------------------------------------------
    def count(self, name: str, by: int = 1) -> None:
        self._counters.count(name, by)

    def counters(self) -> dict[str, int]:
        return self._counters.counters()


def live_leases_of(peer_id: str, now: float) -> Callable[[tuple[int, int], dict[int, Lease]], list[int]]:
    """The slots of a kept view whose lease is ``peer_id``'s and live at ``now`` (the part reads the clock a moment
    later, so a lease that ran out in between stays in the table, not in the view: nothing but the count of leases
    that expired reads such a row)."""
    return lambda _, view: [slot for slot, lease in view.items() if lease.peer_id == peer_id and lease.deadline >= now]
