"""Engine classes (``runtime.peer.engine_class``: the engine, numpy's version, its BLAS and the SIMD its kernels use):
what each peer trains on, and which slots of a round only a copy from a peer of the same class can check, because the
host's replays cannot judge their engine (a task whose units part ways across engines, replayed on the browser's
engine, and a native peer). BOINC calls this homogeneous redundancy: a unit's replicas go to hosts of one class, whose
results must then agree exactly. ``UnitCopies`` hands out and compares the copies; this part remembers the classes.

A class is what a peer says (when it joins, then in each result): claiming another class buys a liar nothing but
copies from that class's peers, who agree with each other and not with it. Two colluding identities that claim a
class of their own can confirm each other, as any two colluders can where nothing replays their results (see
docs/sessions/defences.md's bound); ``--ban-addresses`` makes them come from two addresses. The classes live in
memory: after a restart they are learnt again from the next results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime.peer import BIT_EXACT_ENGINES
from server.relay.context import Part, RelayContext

LOG = logging.getLogger("peertrain.relay")
# The outcomes that settle a slot only its class can check: a copy from another class says nothing of it.
SETTLED_IN_CLASS = ("identical", "upheld", "replaced", "lied")


class EngineClasses(Part):
    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self.of: dict[str, str] = {}  # peer -> the engine class it said
        self.slots: dict[tuple[int, int], str] = {}  # (round, slot) -> the class whose copy checks its result

    def reset(self) -> None:
        self.of, self.slots = {}, {}

    def note(self, peer_id: str, engine_class: str) -> None:
        """What ``peer_id`` trains on, as it said when it joined or as its latest result says."""
        if engine_class:
            self.of[peer_id] = engine_class

    def engine(self, peer_id: str) -> str:
        """The engine ``peer_id`` said it trains on ("" where it said nothing yet)."""
        return self.of.get(peer_id, "").split(" ")[0]

    def can_check(self, peer_id: str, engine: str, engine_class: str) -> bool:
        """Whether a result of ``peer_id`` on ``engine`` (which the host's replays cannot judge) can be checked by a
        copy: the session trains copies (``--redundancy``), the engine computes bit for bit within its class, and
        another connected peer in good standing says it trains on ``engine_class``."""
        if self.options.redundancy <= 0 or engine not in BIT_EXACT_ENGINES or self.session.task.kind == "local":
            return False
        return any(peer != peer_id and self.of.get(peer) == engine_class and not self.store.ban_reason(peer)
                   for peer in self.store.active_peers(self.options.peer_timeout))

    def require(self, round_index: int, slot: int, engine_class: str, why: str) -> None:
        """The result of ``slot`` (of ``engine_class``) is checked by a copy from its class, where a replay would have
        checked it (``why``: the peer's first result, its coverage bound, the sampled share, a suspect direction)."""
        self.slots[(round_index, slot)] = engine_class
        self.store.count("copies_for_engine_class")
        LOG.info("round %d slot %d: a copy from a peer on %s checks it (%s)", round_index, slot, engine_class, why)

    def pending(self, round_index: int) -> list[int]:
        return [slot for (r, slot) in self.slots if r == round_index]

    def admits(self, peer_id: str, round_index: int, slot: int) -> bool:
        """Whether ``peer_id`` may train ``slot``'s copy as far as classes go (any peer, unless only a class can)."""
        engine_class = self.slots.get((round_index, slot))
        return engine_class is None or self.of.get(peer_id) == engine_class

    def others(self, round_index: int, slot: int, peers: Callable[[], list[str]]) -> list[str]:
        """Of ``peers()`` (read only where needed: a relay's connected peers), those that may not train ``slot``
        again after a dispute (none unless only a class can)."""
        engine_class = self.slots.get((round_index, slot))
        return [] if engine_class is None else [peer for peer in peers() if self.of.get(peer) != engine_class]

    def forget_through(self, round_index: int) -> None:
        """A merged round's slots are forgotten."""
        self.slots = {key: value for key, value in self.slots.items() if key[0] > round_index}
