"""Which results a second copy checks (``CopyChoice``, held by ``server.relay.copies.UnitCopies``).

Three reasons, as BOINC replicates: every result of a peer no copy has confirmed yet (a newcomer); a result of an
engine the host cannot replay, where a replay would have checked it (``server.relay.engine_classes``); and a share
``F`` (``--redundancy``) of the rest. Without ``--verify-trust`` the share is a seeded coin per slot, known at
hand-out, so a copy may start while the first peer trains. With ``--verify-trust W`` (adaptive replication, as the
host's replays have it: ``server.relay.coverage``) the choice is made when the result comes, by its peer's record:
each copy it passes in a row doubles its window (``--verify-every`` N, 2N, ... W) and halves its share, so a peer
with a long record is copied with a probability that falls with it, never to zero: at least one of any W of its
results, drawn in secret. Its copies then start when its result is in. A peer cannot tell either way: a copy's job
is the slot's job as anyone gets it. The record (which peers a copy confirmed) is read back from the store after a
restart; the windows start afresh, as the replays' do.
"""

from __future__ import annotations

from server.relay.context import Part, RelayContext
from server.relay.coverage import Coverage
from server.relay.engine_classes import EngineClasses
from server.relay.verify import sampled


class CopyChoice(Part):
    def __init__(self, context: RelayContext, classes: EngineClasses) -> None:
        self.context, self.classes = context, classes
        self.confirmed: set[str] = set()  # volunteers (or peers) with a result a copy agreed with (or a quorum upheld)
        self._unconfirmed: set[tuple[int, int]] = set()  # (round, slot) whose result came from a peer not confirmed
        self._chosen: set[tuple[int, int]] = set()  # (round, slot) adaptive replication chose by its peer's record
        self.record = Coverage(context.options.verify_every, context.session.config.seed, context.options.verify_trust,
                               identity=lambda peer_id: self.store.identity(peer_id))

    @property
    def adaptive(self) -> bool:
        """Whether the share falls with each peer's record (``--verify-trust W`` past ``--verify-every N``)."""
        return self.options.verify_trust > self.options.verify_every > 0

    def redundant(self, round_index: int, slot: int) -> bool:
        """Whether the slot gets a second copy (never a local unit): see the module's text."""
        key = (round_index, slot)
        return self.options.redundancy > 0 and self.session.task.kind != "local" and (
            key in self._unconfirmed or key in self.classes.slots or key in self._chosen or (
                not self.adaptive and sampled(self.session.config.seed, round_index, slot, self.options.redundancy,
                                              "redundancy")))

    def note_result(self, round_index: int, slot: int, peer_id: str) -> None:
        """A slot's result came in: a newcomer's is copied; with adaptive replication, its peer's record decides."""
        if self.options.redundancy <= 0:
            return
        chosen = self.store.identity(peer_id) not in self.confirmed
        if chosen:
            self._unconfirmed.add((round_index, slot))
        elif self.adaptive:
            share = self.record.share(self.options.redundancy, peer_id)
            chosen = self.record.due(peer_id) or sampled(self.session.config.seed, round_index, slot, share,
                                                         "redundancy")
            if chosen:
                self._chosen.add((round_index, slot))
        self.record.note(peer_id, checked=chosen)

    def confirm(self, *peers: str) -> None:
        """A copy agreed with these peers' results (or a quorum upheld them): each has a record, one pass longer."""
        for peer in peers:
            if not self.store.ban_reason(peer):
                self.confirmed.add(self.store.identity(peer))
                self.record.passed(peer)

    def against_a_record(self, losers: list[str], winners: list[str]) -> bool:
        """Whether a quorum of ``winners`` would outvote a peer a copy confirmed while none of them is confirmed
        (newcomers that agree outvote no confirmed peer: one cheat run twice)."""
        confirmed, who = self.confirmed, self.store.identity
        return bool({who(p) for p in losers} & confirmed) and not {who(p) for p in winners} & confirmed

    def restore(self) -> None:
        """After a restart: the peers a copy confirmed, read back from the store."""
        self.confirmed |= {self.store.identity(peer) for peer in self.store.confirmed_peers()
                           if not self.store.ban_reason(peer)}

    def forget_record(self, peer_id: str) -> None:
        """A lifted ban: the peer's record of passed copies starts afresh."""
        self.record.forget(peer_id)

    def forget_through(self, round_index: int) -> None:
        self._unconfirmed = {key for key in self._unconfirmed if key[0] > round_index}
        self._chosen = {key for key in self._chosen if key[0] > round_index}
