"""Bans (``Bans``, a part of the relay): a peer whose result fails its replay, or that claims more examples than
its unit holds, loses its token for the session; with ``--ban-addresses`` its address may not join again either;
its results of the open round are dropped and its live leases released, so their slots are handed out again at once
(or a copy that matched one of them takes its place): nothing waits for a banned peer. What its results of merged
rounds moved is undone before the next merge (``server.relay.undo``). Stored in SQLite, so a ban survives a restart;
the admin API lifts one (``unban``).

A ban that comes while a merge runs (a second copy's replay, a claim) leaves the round being merged alone (the merge
has taken its results); the undo that follows the merge, under the same lock, merges that round again without it."""

from __future__ import annotations

from collections.abc import Callable

from server.relay.book import RoundBook
from server.relay.context import RelayContext
from server.relay.copies import UnitCopies
from server.relay.undo import BanUndo


class Bans:
    def __init__(self, context: RelayContext, book: RoundBook, copies: UnitCopies, undo: BanUndo, *,
                 on_unban: Callable[[str], None] = lambda peer_id: None,
                 on_ban: Callable[[str], None] = lambda peer_id: None) -> None:
        self.context, self.book, self.copies, self.undo = context, book, copies, undo
        self.on_unban = on_unban  # (the replays' record of the peer starts afresh: server.relay.coverage)
        self.on_ban = on_ban  # (the round mode's part: async, its results still in the buffer go)

    def ban(self, peer_id: str, reason: str) -> None:
        """Ban the peer, and every other peer of its volunteer (each worker and tab of the same key: a ban follows
        the key, ``server.relay.volunteers``)."""
        store, round_index = self.context.store, self.context.session.round
        if store.ban_reason(peer_id) is None:
            store.ban(peer_id, reason)
            store.count("peers_banned")
            volunteer = store.volunteer_of(peer_id)
            for sibling in store.volunteer_peers(volunteer) if volunteer else []:
                if store.ban_reason(sibling) is None:
                    self.ban(sibling, f"the same volunteer as {peer_id}: {reason}")
        released = store.release_leases_of(peer_id)
        if released:
            store.count("leases_released_by_ban", released)
        if not (self.context.merging and self.undo.active):  # (a merge has taken the round: the undo redoes it)
            weights = {slot: self.copies.weights(round_index, slot)
                       for slot in self.book.slots_of(round_index, peer_id)}
            for slot in store.remove_results_of(peer_id, round_index):
                self.book.drop(round_index, slot, weights.get(slot))
                store.count("results_dropped_by_ban")
                self.copies.promote_settled_copy(round_index, slot)
        self.on_ban(peer_id)
        self.undo.request(peer_id)
        self.context.notices.work_changed()

    def ban_for_claim(self, peer_id: str, message: str) -> None:
        """An honest peer's runtime never claims more examples than its unit holds."""
        self.ban(peer_id, f"claimed more examples than its unit holds ({message})")

    def unban(self, peer_id: str) -> bool:
        """Lift the peer's ban, and its volunteer's other peers' (the key's ban is one ban)."""
        store = self.context.store
        volunteer = store.volunteer_of(peer_id)
        lifted = False
        for peer in {peer_id, *(store.volunteer_peers(volunteer) if volunteer else [])}:
            if store.unban(peer):
                lifted = True
                self.on_unban(peer)
        self.context.notices.changed()
        return lifted
