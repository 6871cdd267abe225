"""Whose files a synchronous round of a local task has counted (``LocalTurns``, used by ``SyncRounds`` and the
backups).

A local task's unit is "train on your own files". Two units of one round trained on one volunteer's files count
those files twice and someone else's not at all: with each volunteer holding mostly one class (the CSV example), a
page that happened to be faster took two of a round's three units and the session ended at 0.87 where the same
volunteers taking one unit each reach 0.95. So while a connected peer of another volunteer could take the unit, a
volunteer whose files trained (or are training) a unit of the round waits; with nobody else connected it goes on (a
volunteer alone still trains every unit in turn, and a unit whose lease ran out still gets trained). A backup of a
straggling local unit goes only to a volunteer whose files the round has not counted: the straggler's lease covers
a page that died. A volunteer is the identity behind a peer (``Store.identity``): a page's workers count as one.
"""

from __future__ import annotations

from server.relay.context import Part, RelayContext


class LocalTurns(Part):
    def __init__(self, context: RelayContext) -> None:
        self.context = context

    @property
    def applies(self) -> bool:
        return self.session.task.kind == "local" and self.session.config.mode != "async"

    def counted(self, round_index: int, now: float) -> set[str]:
        """The volunteers whose files trained a merged result of the round or hold a live lease on one of its units
        (either copy) without a result."""
        store = self.store
        results = store.result_slots(round_index)
        peers = {peer for slot in results if (peer := store.result_peer(round_index, slot)) is not None}
        for copy in (0, 1):
            peers |= {lease.peer_id for slot, lease in store.leases(round_index, copy).items()
                      if slot not in results and lease.deadline >= now}
        return {store.identity(peer) for peer in peers}

    def wait(self, peer_id: str, round_index: int, now: float) -> str | None:
        """Why ``peer_id`` gets no unit of the round now (its volunteer's files counted already and another
        volunteer's could), or None."""
        if not self.applies:
            return None
        counted = self.counted(round_index, now)
        if self.store.identity(peer_id) not in counted:
            return None
        connected = {self.store.identity(peer) for peer in self.store.active_peers(self.options.peer_timeout)}
        if not connected - counted:
            return None
        return (f"round {round_index + 1}: your files trained a unit of this round; its other units go to peers "
                "whose files it has not counted yet")

    def may_back_up(self, peer_id: str, round_index: int, now: float) -> bool:
        """Whether ``peer_id`` may train a backup of a unit of the round: always, but in a local task only a volunteer
        whose files the round has not counted."""
        return not self.applies or self.store.identity(peer_id) not in self.counted(round_index, now)
