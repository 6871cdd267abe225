"""The relay store's concepts but opening and closing (``server.relay.store.protocol``: the contract they keep, and
``Store``, their union): one small protocol each for peers, leases, results, second copies, bans, undos, replay
jobs, volunteers, the host's pause and counters (the asynchronous buffer's: ``server.relay.store.arrival_concepts``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from server.relay.store.records import (
    FinishedReplay,
    ForwardedResult,
    Lease,
    PendingUndo,
    ReplayJob,
    StoredResult,
)

# authenticate() writes a peer's last_seen at most once per this many seconds: each write is a commit, and a peer
# makes several requests per unit; "connected" is judged over the peer timeout (30 s by default).
LAST_SEEN_RESOLUTION = 1.0


class PeerStore(Protocol):
    def add_peer(self, agent: str = "", address: str = "") -> tuple[str, str]:
        """A new peer, seen now: (its id, its token). Only the token's hash is kept."""

    def authenticate(self, peer_id: str, token: str, *, touch: bool = True) -> bool:
        """Whether ``token`` is ``peer_id``'s (False for an unknown peer), compared in constant time. A match
        refreshes last_seen, at most once per ``LAST_SEEN_RESOLUTION`` seconds, unless ``touch`` is False (a request
        of a peer that left, still in flight, does not make it connected again). A wrong token touches nothing."""

    def depart(self, peer_id: str) -> None:
        """``peer_id`` said it is leaving: it stops counting as connected and against its address's cap at once.
        Its token stays valid: asking for work again brings it back."""

    def active_peers(self, within_seconds: float) -> list[str]:
        """Sorted ids of the peers seen within ``within_seconds`` or holding a live lease (a peer deep in a unit
        does not poll), less the banned: nothing waits for a banned peer."""

    def live_peers_at(self, address: str, within_seconds: float) -> int:
        """Peers from ``address`` seen within ``within_seconds`` (the cap on live peers per address)."""

    def addresses(self, within_seconds: float) -> int:
        """Distinct client addresses with a peer seen within ``within_seconds``."""

    def peer_count(self) -> int:
        """Peers that ever joined."""

    def peer_address(self, peer_id: str) -> str:
        """The address ``peer_id`` joined from ("" when unknown)."""

    def peers_listing(self) -> list[dict[str, Any]]:
        """Every peer in joining order (``GET /api/admin/peers``): peer_id, address, agent, joined, last_seen,
        units_done, banned, ban_reason, banned_at (the last two None unless banned)."""

    def recent_peers(self, limit: int) -> list[dict[str, Any]]:
        """The ``limit`` peers seen most recently, the latest first (among those seen at once, in joining order),
        listed as ``peers_listing`` lists them: what the status shows, read without every peer of a crowd."""


class LeaseStore(Protocol):
    def leases(self, round_index: int, copy: int = 0) -> dict[int, Lease]:
        """The leases of ``round_index`` by slot, expired ones included: the units' own (``copy`` 0) or their
        second copies (1). Empty when there are none."""

    def lease(self, round_index: int, slot: int, copy: int = 0) -> Lease | None:
        """One lease, read now from the database (never from what the store keeps: another relay may have granted
        it a moment ago); None where there is none."""

    def grant(self, round_index: int, slot: int, unit_index: int, peer_id: str, seconds: float,
              copy: int = 0, *, version: int = 0) -> Lease | None:
        """Lease the slot's unit (or its second copy) to ``peer_id`` from now for ``seconds``, replacing a lease on
        the same (round, slot, copy) that ran out or is ``peer_id``'s own; None where another peer holds a live one
        (granted meanwhile by another relay over the same store: the database decides, in one statement), or, for
        the asynchronous stream (round -1), where the entry has its result. ``version``: the weights version the
        unit is handed out with (the lease keeps it: whichever relay the result reaches checks it)."""

    def release(self, round_index: int, slot: int, peer_id: str | None = None) -> None:
        """Drop the leases on a slot (its result was refused), or only ``peer_id``'s: the next peer to ask may
        take it."""

    def swap_copies(self, round_index: int, slot: int) -> None:
        """The second copy's lease becomes the unit's own and the other way round (its result came first)."""

    def release_leases_of(self, peer_id: str) -> int:
        """Drop the live leases ``peer_id`` holds (it was banned); returns how many."""

    def release_leases_on_leaving(self, peer_id: str) -> int:
        """Drop every live lease ``peer_id`` holds (it left); returns how many were on units it had not delivered
        (a second copy counts as undelivered): those go to the next peer that asks."""

    def release_live_leases(self) -> int:
        """After a restart nobody holds anything: drop every lease but the units' own leases of slots with a result;
        returns how many went."""


class ResultStore(Protocol):
    def add_result(self, result: StoredResult, *, count_unit: bool = True) -> None:
        """Keep an accepted result (received now, with its message's sha256 and size for the audit) and, unless
        ``count_unit`` is False (a promoted copy was counted when it came in), count a unit done by its peer.
        A second result on the same (round, slot) is an error."""

    def result_slots(self, round_index: int) -> set[int]:
        """The slots of ``round_index`` that have a result, without reading the messages."""

    def result_peer(self, round_index: int, slot: int) -> str | None:
        """Who delivered the slot's result (None: no result)."""

    def has_result(self, round_index: int, slot: int) -> bool:
        """Whether the slot has its result, read now from the database (another relay may have kept it a moment ago:
        ``result_slots`` is what the store keeps)."""

    def results(self, round_index: int) -> dict[int, StoredResult]:
        """The round's results by slot, messages included (an emptied message is ``b""``)."""

    def result(self, round_index: int, slot: int) -> StoredResult | None:
        """One slot's result, its message included (None: no result)."""

    def all_results(self) -> list[StoredResult]:
        """Every result, by round and slot."""

    def replace_message(self, round_index: int, slot: int, message: bytes) -> None:
        """Store ``message`` in place of the result's (a ban's undo rebases it); its audit sha256 and size stay
        those of the upload."""

    def remove_result(self, round_index: int, slot: int) -> None:
        """Forget the slot's result (nothing when there is none)."""

    def remove_results_of(self, peer_id: str, round_index: int) -> list[int]:
        """Drop ``peer_id``'s results and leases of ``round_index`` (a banned peer); returns the results' slots."""

    def reset_round(self, round_index: int) -> int:
        """Forget the round's results, second copies and leases (its weights changed under it: a ban's undo);
        returns how many results went. Their units are handed out again."""

    def set_verification(self, round_index: int, slot: int, peer_id: str, outcome: str) -> None:
        """Append how the slot's result (round -1: entry ``slot``'s arrival) was checked to its audit row, if it is
        ``peer_id``'s (outcomes joined by "; ", cut at 500 characters once there are several)."""

    def audit(self) -> list[dict[str, Any]]:
        """Results by round and slot, then merged arrivals (round: the merge; slot: the entry; and started_from):
        round, slot, unit_index, peer_id, num_examples, metrics, sha256, size, verification, message_kept, received."""

    def prune_before(self, round_index: int) -> int:
        """Empty the result and second-copy messages of rounds before ``round_index`` (merged and checkpointed);
        returns how many were emptied. Their audit rows stay."""


class CopyStore(Protocol):
    """Second copies of a unit (redundancy, backups): compared with the merged result, never merged themselves."""

    def add_copy(self, round_index: int, slot: int, peer_id: str, message: bytes, outcome: str, *,
                 count_unit: bool = True, sha256: str | None = None) -> None:
        """Keep ``peer_id``'s copy of the slot (replacing its earlier one) and count a unit done by it (unless
        ``count_unit`` is False: a merged result kept as a copy, counted when it came). ``sha256``: the digest of
        the copy's message where ``message`` is empty (a copy whose bytes nothing will read again), else computed."""

    def set_copy_outcome(self, round_index: int, slot: int, peer_id: str, outcome: str) -> None:
        """What comparing the copy found (nothing when there is no such copy)."""

    def copies(self, round_index: int) -> dict[tuple[int, str], str]:
        """(slot, peer) -> outcome of the round's second copies, without their messages."""

    def copy_message(self, round_index: int, slot: int, peer_id: str) -> bytes | None:
        """The copy's message (None: no such copy; ``b""`` once pruned)."""

    def confirmed_peers(self) -> set[str]:
        """Peers a comparison confirmed, in any round: a copy that matched the merged result (both peers), one a
        replay or a quorum upheld, one that took a banned peer's place, and the result of a slot whose copies a
        quorum upheld (bans are the caller's business)."""


class BanStore(Protocol):
    def ban(self, peer_id: str, reason: str) -> str:
        """Ban ``peer_id`` (again: the new reason and time replace the old); returns its address ("" when the
        peer is unknown), which is banned with it. The reason is kept to 500 characters."""

    def unban(self, peer_id: str) -> bool:
        """Lift the ban; False when there was none."""

    def ban_reason(self, peer_id: str) -> str | None:
        """Why ``peer_id`` is banned (None: it is not)."""

    def address_banned(self, address: str) -> bool:
        """Whether a banned peer joined from ``address`` (False for "")."""


class UndoStore(Protocol):
    """Undoing what a banned peer's results moved (``server.relay.undo``)."""

    def request_undo(self, peer_id: str) -> None:
        """A ban asks for its peer's results to be undone: a new request is pending; one pending or running stays
        as it is; one done is asked again (an unban and a second ban)."""

    def undos(self) -> list[PendingUndo]:
        """The undos not done, oldest first (a new request's plan is ``{}``)."""

    def set_undo(self, peer_id: str, state: str, plan: dict[str, Any]) -> None:
        """Record the undo's progress (``state`` "done" ends it)."""

    def unverified_rounds(self, peer_id: str) -> tuple[int | None, list[int]]:
        """(the round of ``peer_id``'s last result that passed a host replay, or None; the sorted rounds of its
        results from then on that did not, and are not undone yet)."""

    def mark_undone(self, peer_id: str, first: int, end: int) -> int:
        """Mark ``peer_id``'s unverified results of rounds ``first`` to ``end - 1`` undone (merged no more; their
        audit rows stay, their verification starting "undone"); returns how many."""

    def undone_slots(self, round_index: int) -> set[int]:
        """The slots of ``round_index`` whose results were marked undone."""

    def pruned_rounds(self, first: int, end: int) -> set[int]:
        """Rounds from ``first`` to ``end - 1`` with a result whose message was emptied (``prune_before``)."""


class ReplayJobStore(Protocol):
    """Replays done by verification workers (``serve --remote-replays``, ``peertrain verify-worker``): the relay
    queues each replay, a worker anywhere claims it for a while, replays it and sends back the result; a claim that
    runs out (its worker died) goes to the next worker that asks."""

    def add_replay_job(self, *, job: str, task: bytes, weights: bytes, unit: bytes, engine: str) -> int:
        """Queue a replay of ``job`` (its JSON) from the global ``weights`` (a weights message) on the task ``task``
        describes (its JSON) and the unit's data; returns its id (rising). The task and the weights are kept once
        under their sha256 however many replays share them (``blob``), for as long as a queued replay needs them."""

    def blob(self, digest: str) -> bytes | None:
        """A queued replay's task or weights by sha256 (None: none kept)."""

    def claim_replay_job(self, worker: str, seconds: float) -> ReplayJob | None:
        """The oldest replay neither finished nor claimed (or whose claim ran out), now ``worker``'s for
        ``seconds``; None when there is none. Two workers never hold the same claim."""

    def finish_replay_job(self, job_id: int, worker: str, result: FinishedReplay) -> bool:
        """Record ``worker``'s result of a replay it holds the claim of; False (nothing recorded) when its claim ran
        out and another worker claimed it, or the replay is finished or gone."""

    def finished_replay_jobs(self, job_ids: Collection[int]) -> dict[int, FinishedReplay]:
        """The results of the replays among ``job_ids`` that are finished."""

    def forget_replay_jobs(self, job_ids: Collection[int] | None) -> None:
        """Drop these replays (their result read, or no longer wanted; None: every one, as a relay starts) and the
        weights no replay needs any more."""

    def replay_jobs_waiting(self) -> int:
        """Replays queued and not finished (claimed or not)."""


class VolunteerStore(Protocol):
    """Volunteers: a key a page proved when it joined (``server.relay.volunteers``), its peers, its name and team;
    the rows credit is counted from (``server.relay.credit``)."""

    def attach_volunteer(self, peer_id: str, volunteer_id: str, public_key: str, *, name: str | None = None,
                         team: str | None = None) -> None:
        """``peer_id`` is one of ``volunteer_id``'s peers (the volunteer is created on its first join, with its
        public key); a ``name`` or ``team`` given replaces the volunteer's."""

    def set_profile(self, volunteer_id: str, *, name: str | None, team: str | None) -> None:
        """Replace the volunteer's display name and team (None: leave it)."""

    def volunteer_of(self, peer_id: str) -> str:
        """The volunteer ``peer_id`` joined as ("" for a peer that proved no key, or an unknown one)."""

    def identity(self, peer_id: str) -> str:
        """Who a peer is for its record: its volunteer, or the peer itself where it proved no key."""

    def volunteer_peers(self, volunteer_id: str) -> list[str]:
        """Every peer the volunteer joined, oldest first."""

    def volunteer_banned(self, volunteer_id: str) -> str | None:
        """Why one of the volunteer's peers is banned (None: none is)."""

    def volunteers(self) -> dict[str, dict[str, Any]]:
        """Every volunteer: its name, team, when it first and last joined."""

    def credit_rows(self) -> tuple[list[tuple], list[tuple]]:
        """The rows credit is counted from: every result (round, slot, unit index, peer, volunteer, examples,
        verification, received, banned) and every merged arrival (merge, unit index, peer, volunteer, examples,
        received, banned)."""


class PauseStore(Protocol):
    """The host's pause (``server.relay.admin``), kept where every relay serving the session reads it: a replica
    hands out nothing while the relay holding the session is paused, and a restarted relay stays paused."""

    def set_pause(self, paused: bool, pause_from: int | None) -> None:
        """Paused (no work handed out) or not; ``pause_from``: the round from which work stops (None: no such
        round)."""

    def pause(self) -> tuple[bool, int | None]:
        """What ``set_pause`` set last ((False, None) when never), as the store keeps it (a shared store's: at most a
        moment old, like the leases it keeps)."""


class RefusalStore(Protocol):
    """The peers refused on each slot (a result refused for what it held), not handed that slot again this round while
    another connected peer may take it (``server.relay.book``). Kept here only where relays share the store, so that a
    replica honours the holder's refusals and the holder a replica's; one relay keeps them in its own memory."""

    def refuse_slot(self, round_index: int, slot: int, peers: Collection[str]) -> None:
        """``peers`` were refused on ``slot`` of ``round_index`` (the async stream: ``ASYNC_ROUND`` and its entry)."""

    def slot_refusals(self, round_index: int) -> dict[int, frozenset[str]]:
        """Slot -> the peers refused on it, as the store keeps it (a shared store's: at most a moment old)."""

    def forget_refusals(self, *, before: int | None = None, since: int | None = None) -> None:
        """Forget the refusals of rounds before ``before`` (after a merge: the async stream's go too), or from
        ``since`` on (a ban's undo starts those rounds again)."""


class WantedCopyStore(Protocol):
    """The slots of the open round that want a second copy, as the relay holding a synchronous session chose them
    (``server.relay.copy_choice``: its memory), kept where its replicas read them to hand the copies out too."""

    def want_copies(self, round_index: int, slots: Collection[int]) -> None:
        """The slots of ``round_index`` that want a copy now (those of other rounds are forgotten)."""

    def wanted_copies(self, round_index: int) -> frozenset[int]:
        """What ``want_copies`` said last of ``round_index``, read now from the database."""


class ForwardStore(Protocol):
    """Results of a synchronous session that a replica took, handed to the relay holding the session (which alone
    decides a round: its sums, copies and replays live in one process), and that relay's verdict on each, which the
    replica answers its peer with (``server.relay.sharing``)."""

    def forward_result(self, round_index: int, slot: int, peer_id: str, message: bytes) -> int:
        """Hand a result over; its number (later results have larger ones)."""

    def forwarded(self, limit: int) -> list[ForwardedResult]:
        """Up to ``limit`` results handed over and not judged yet, oldest first."""

    def settle_forwarded(self, forward_id: int, verdict: dict[str, Any]) -> None:
        """The holder's verdict on a result handed over (what its peer is answered)."""

    def take_verdicts(self, forward_ids: Collection[int]) -> dict[int, dict[str, Any]]:
        """The verdicts there are on these results handed over (their rows go with them); one not judged yet is not
        in the answer."""

    def withdraw_forwarded(self, forward_id: int) -> bool:
        """Take back a result not judged yet (its replica stopped waiting): whether it was still waiting (False: it
        was judged meanwhile, and ``take_verdicts`` has the verdict)."""


class CounterStore(Protocol):
    def count(self, name: str, by: int = 1) -> None:
        """Add ``by`` to the counter ``name`` (created at 0)."""

    def counters(self) -> dict[str, int]:
        """Every counter by name, sorted (a counter never counted is absent)."""
