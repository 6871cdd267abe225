"""Who takes part, for the page's participants table: a mixin of ``Relay``.

Per peer: a short id, the engine its results say (Pyodide on the CPU, WebGPU, native), units done, the median
time from hand-out to result of its last units, when it was last seen, refusals of its results and its ban.
Units done and bans live in SQLite; engines, unit times and refusals are kept in memory since the relay
started (a restart shows them again from the next result).
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

from server.relay.sqlite_store import Store

TIMES_KEPT = 20  # unit times per peer behind its median
PARTICIPANTS_SHOWN = 100  # the most recently seen peers the status lists
ENGINES = {"pyodide-numpy": "CPU (Pyodide)", "pyodide-webgpu": "WebGPU (Pyodide)", "native-numpy": "native"}


class Participants:
    """Needs from the relay: ``store``."""

    store: Store

    def _people(self) -> dict[str, dict[str, Any]]:
        return self.__dict__.setdefault("_people_stats", {})  # type: ignore[no-any-return]

    def _person(self, peer_id: str) -> dict[str, Any]:
        return self._people().setdefault(peer_id, {"seconds": deque(maxlen=TIMES_KEPT), "engine": "",
                                                   "refusals": 0})

    def note_unit(self, peer_id: str, seconds: float, engine: str) -> None:
        person = self._person(peer_id)
        person["seconds"].append(max(0.0, seconds))
        person["engine"] = engine or person["engine"]

    def note_refusal(self, peer_id: str) -> None:
        self._person(peer_id)["refusals"] += 1

    def participants(self) -> list[dict[str, Any]]:
        now, people = self.store.clock(), self._people()
        listing = sorted(self.store.peers_listing(), key=lambda p: p["last_seen"], reverse=True)
        rows = []
        for peer in listing[:PARTICIPANTS_SHOWN]:
            stats = people.get(peer["peer_id"], {})
            seconds = list(stats.get("seconds", ()))
            rows.append({"peer": peer["peer_id"][:8], "device": ENGINES.get(stats.get("engine", ""),
                                                                           stats.get("engine") or ""),
                         "units_done": peer["units_done"],
                         "median_unit_seconds": statistics.median(seconds) if seconds else None,
                         "last_seen_seconds": max(0.0, now - peer["last_seen"]),
                         "refusals": stats.get("refusals", 0), "banned": peer["banned"]})
        return rows
