"""The coverage bound (``Coverage``, held by ``server.relay.verify.ReplayQueue``): no peer goes more than N accepted
results without a check (``--verify-every N``), whatever the random share draws.

After each check of a peer's result (any reason: its first, the sampled share, a suspect's, this bound's), a seeded
draw places the next one: the p-th accepted result after it, p uniform in 1..N, unless another check comes first
(each check starts a new window and a new draw). So a peer is never more than N - 1 results from a check, and it
cannot time its lies: from what it knows (a passed check is silent) each of its results may be the checked one, the
first after a check with probability 1/N. A fixed "every N-th result" would be timeable: a peer that lies on the
N - 1 results after its first, which is always checked, risks only the random share on them, and the one check it
must pass is known in advance. The price of the uniform draw is more replays: 2 / (N + 1) of a peer's results from
this bound alone (40 % at N = 4), besides the random share.

Decided at hand-out: whether a peer's next result is due is known before it trains it (``due``), so its replay
starts with the unit (``ReplayChecks.prepare``). The draw is keyed by the session's seed (as the sampled share's),
the peer and its number of checks so far; nothing of it reaches a peer.

A relay restart starts every peer's count afresh, and the first result of each peer after a restart is replayed as
its first (``ReplayQueue`` starts empty), which closes any window left open: the bound holds across a restart. (A
replay still running when the relay stopped is lost with it; that result's audit row stays "not checked".)

Trust earned (``--verify-trust W``, BOINC's adaptive replication in the host's terms): a peer earns trust by checks
it passes in a row. Its window doubles with each (N, 2N, 4N, ... up to W) and the random share halves with each, so a
peer with a long record is checked with a probability that falls with it, never to zero: at least one of any W
results, about 2 / (W + 1) of them. A failed check bans the peer as ever; lifting a ban starts its record afresh,
as does a restart. What an undetected liar can do is bounded by the window: a peer that turns after earning full
trust has each of its results checked with probability at least 1/W and is checked within W results at the latest,
then banned, and a ban's undo merges again every round from its last passed check (``server.relay.undo``): at most
W - 1 lying results merged, each clipped by the aggregator, and all of them undone, unless the session ends first.
Without ``--verify-trust`` (0, or W <= N) the window stays N and the share stays as given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_VERIFY_EVERY = 4


@dataclass
class Coverage:
    every: int  # N (0: no bound)
    seed: int
    trust: int = 0  # W: the widest window a record of passed checks earns (<= N: no trust earned)
    # who a peer is for its record: its volunteer (every peer of one key shares one record), or itself
    identity: Callable[[str], str] = field(default=lambda peer_id: peer_id)
    _unchecked: dict[str, int] = field(default_factory=dict)  # accepted results since the peer's last check
    _checks: dict[str, int] = field(default_factory=dict)  # checks so far: which draw places the next one
    _passed: dict[str, int] = field(default_factory=dict)  # checks passed in a row (the record trust is earned by)
    _windows: dict[str, int] = field(default_factory=dict)  # the size of the peer's open window

    def window(self, peer_id: str) -> int:
        """The size of the peer's open window: N, or with trust N times 2 to the checks passed in a row, up to W."""
        peer_id = self.identity(peer_id)
        return self._windows.get(peer_id, self.every)

    def earned(self, peer_id: str) -> int:
        """How many checks in a row the peer passed (its record; 0 without ``trust``)."""
        peer_id = self.identity(peer_id)
        return self._passed.get(peer_id, 0)

    def share(self, fraction: float, peer_id: str) -> float:
        """The random share for this peer: ``fraction``, halved for each check passed in a row (with trust)."""
        peer_id = self.identity(peer_id)
        return fraction if fraction >= 1 else fraction / 2 ** min(self.earned(peer_id), 60)

    def passed(self, peer_id: str) -> None:
        """A check of the peer passed: one more on its record (the window it opens next is wider)."""
        peer_id = self.identity(peer_id)
        if self.trust > self.every > 0:
            self._passed[peer_id] = self._passed.get(peer_id, 0) + 1

    def forget(self, peer_id: str) -> None:
        """The peer's record starts afresh (its ban was lifted): the narrowest window from its next check."""
        peer_id = self.identity(peer_id)
        self._passed.pop(peer_id, None)
        self._windows.pop(peer_id, None)

    def position(self, peer_id: str) -> int:
        """Which accepted result after the peer's last check is checked, 1..window (a seeded draw per window)."""
        peer_id = self.identity(peer_id)
        window = self._checks.get(peer_id, 0)
        digest = hashlib.sha256(f"coverage:{self.seed}:{peer_id}:{window}".encode()).digest()
        return 1 + int.from_bytes(digest[:8], "little") % self.window(peer_id)

    def due(self, peer_id: str) -> bool:
        """Whether the peer's next accepted result must be checked."""
        peer_id = self.identity(peer_id)
        return self.every > 0 and self._unchecked.get(peer_id, 0) + 1 >= self.position(peer_id)

    def unchecked(self, peer_id: str) -> int:
        return self._unchecked.get(self.identity(peer_id), 0)

    def note(self, peer_id: str, *, checked: bool) -> None:
        """An accepted result of the peer: checked (a new window opens) or not (the window goes on)."""
        peer_id = self.identity(peer_id)
        if checked:
            self._unchecked[peer_id] = 0
            self._checks[peer_id] = self._checks.get(peer_id, 0) + 1
            if self.trust > self.every > 0:
                self._windows[peer_id] = min(self.trust, self.every * 2 ** min(self.earned(peer_id), 30))
        else:
            self._unchecked[peer_id] = self._unchecked.get(peer_id, 0) + 1
