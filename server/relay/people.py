"""Who takes part, for the page's participants table (``Participants``, a part of the relay).

Per peer: a short id, the engine its results say (Pyodide on the CPU, WebGPU, native), units done, the median
time from hand-out to result of its last units, when it was last seen, refusals of its results and its ban.
Units done and bans live in SQLite; engines, unit times and refusals are kept in memory since the relay
started (a restart shows them again from the next result).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from server.relay.context import RelayContext

TIMES_KEPT = 20  # unit times per peer behind its median
PARTICIPANTS_SHOWN = 100  # the most recently seen peers the status lists
ENGINES = {"pyodide-numpy": "CPU (Pyodide)", "pyodide-webgpu": "WebGPU (Pyodide)", "native-numpy": "native"}


@dataclass
class PersonStats:
    seconds: deque[float] = field(default_factory=lambda: deque(maxlen=TIMES_KEPT))  # hand-out to result
    engine: str = ""  # what its last result says it trained on
    refusals: int = 0


class Participants:
    """Per-peer figures kept in memory; units done and bans come from the store."""

    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self._stats: dict[str, PersonStats] = {}

    def _person(self, peer_id: str) -> PersonStats:
        return self._stats.setdefault(peer_id, PersonStats())

    def note_unit(self, peer_id: str, seconds: float, engine: str) -> None:
        person = self._person(peer_id)
        person.seconds.append(max(0.0, seconds))
        person.engine = engine or person.engine

    def note_refusal(self, peer_id: str) -> None:
        self._person(peer_id).refusals += 1

    def participants(self) -> list[dict[str, Any]]:
        store = self.context.store
        now = store.clock()
        listing = sorted(store.peers_listing(), key=lambda p: p["last_seen"], reverse=True)
        rows = []
        for peer in listing[:PARTICIPANTS_SHOWN]:
            stats = self._stats.get(peer["peer_id"], PersonStats())
            seconds = list(stats.seconds)
            rows.append({"peer": peer["peer_id"][:8], "device": ENGINES.get(stats.engine, stats.engine),
                         "units_done": peer["units_done"],
                         "median_unit_seconds": statistics.median(seconds) if seconds else None,
                         "last_seen_seconds": max(0.0, now - peer["last_seen"]),
                         "refusals": stats.refusals, "banned": peer["banned"]})
        return rows
