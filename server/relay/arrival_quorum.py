"""BOINC's quorum for async copies that disagree (``Quorum``, a part of ``server.relay.arrival_copies``).

Where no host replay can judge two results of a schedule entry that disagree, neither merges: the entry goes out
again from the same version to a third peer, and the first two results that agree settle it, the agreeing one
merging; every other peer on the entry is banned. Two newcomers that agree never outvote a peer a copy has confirmed
(the entry goes out once more), up to ``QUORUM_LIMIT`` results. Results are compared as copies are
(``checks.compare_copy``: identical bytes are not decoded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from server.relay.checks import AGREE, compare_copy, engines_of
from server.relay.context import Part, RelayContext
from server.relay.copy_choice import CopyChoice
from server.relay.store.records import ASYNC_ROUND


class Quorum(Part):
    """Settles an entry in dispute by a result that agrees with one before it. ``versions``: the weights of the
    versions kept, ``digest`` their sha256 where known; ``ban``: the relay's ban."""

    def __init__(self, context: RelayContext, choice: CopyChoice, *, versions: dict[int, np.ndarray],
                 digest: Callable[[int], str | None], ban: Callable[[str, str], None]) -> None:
        self.context, self.choice, self.versions, self.digest, self.ban = context, choice, versions, digest, ban

    def settle(self, peers: list[str], peer_id: str, version: int, entry: int, body: bytes, meta: Mapping[str, Any],
               vector: np.ndarray) -> bool:
        """``peer_id``'s result of ``entry`` (``body``: its weights ``vector``) against the disputed results of
        ``peers`` before it: settled (True) when it agrees with one, whose peers and it are confirmed and every other
        peer on the entry banned; else (False) it stands with them, nothing changed."""
        base, engine_class = self.versions[version], engines_of(meta)[1]
        agreeing = []
        for other in peers:
            message = self.store.copy_message(ASYNC_ROUND, entry, other)
            if message and compare_copy(self.session, self.options, (engine_class, body, vector), message,
                                        round_index=version, base=base, base_sha256=self.digest(version))[0] in AGREE:
                agreeing.append(other)
        liars = [peer for peer in peers if peer not in agreeing]
        if agreeing and self.choice.against_a_record(liars, [*agreeing, peer_id]):
            self.store.count("quorums_against_a_record")  # (newcomers that agree outvote no confirmed peer)
            agreeing = []
        if not agreeing:
            self.store.count("quorums_undecided")
            return False
        for peer in agreeing:
            self.store.set_copy_outcome(ASYNC_ROUND, entry, peer, "upheld")
        for peer in liars:
            self.store.set_copy_outcome(ASYNC_ROUND, entry, peer, "lied")
        self.choice.confirm(*agreeing, peer_id)
        self.store.set_verification(ASYNC_ROUND, entry, peer_id, f"quorum: agreed with {', '.join(agreeing)}, not "
                                    f"{', '.join(liars)}")
        self.store.count("disputes_settled_by_quorum")
        for peer in liars:
            self.ban(peer, f"its result of unit entry {entry} (version {version}) disagreed with those of "
                     f"{', '.join([*agreeing, peer_id])}, which agree (a quorum of copies)")
        return True
