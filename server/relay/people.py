"""Who takes part, for the page's participants table (``Participants``, a part of the relay).

Per peer (the status's ``participants``): a short id, the engine its results say (Pyodide on the CPU, WebGPU,
native), units done, the median time from hand-out to result of its last units, when it was last seen, refusals of
its results and its ban. Per volunteer (``volunteers``, what the page's table shows): its name or an anonymous
handle, its team, its workers connected now, its peers' figures summed and its credit (``server.relay.credit``);
a peer that proved no key (``server.relay.volunteers``) is a volunteer of its own.
Units done and bans live in the store; engines, unit times and refusals are kept in memory since the relay
started (a restart shows them again from the next result).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from server.relay.context import Part, RelayContext
from server.relay.credit import Credit, handle

TIMES_KEPT = 20  # unit times per peer behind its median
PARTICIPANTS_SHOWN = 100  # the most recently seen peers the status lists
ENGINES = {"pyodide-numpy": "CPU (Pyodide)", "pyodide-webgpu": "WebGPU (Pyodide)", "native-numpy": "native"}


@dataclass
class PersonStats:
    seconds: deque[float] = field(default_factory=lambda: deque(maxlen=TIMES_KEPT))  # hand-out to result
    engine: str = ""  # what its last result says it trained on
    refusals: int = 0


class Participants(Part):
    """Per-peer figures kept in memory; units done and bans come from the store."""

    def __init__(self, context: RelayContext, *, credit: Credit) -> None:
        self.context, self.credit = context, credit
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
        rows = []
        for peer in store.recent_peers(PARTICIPANTS_SHOWN):  # (10,000 peers read and sorted for 100: each status)
            stats = self._stats.get(peer["peer_id"], PersonStats())
            seconds = list(stats.seconds)
            rows.append({"peer": peer["peer_id"][:8], "identity": store.identity(peer["peer_id"]),
                         "device": ENGINES.get(stats.engine, stats.engine),
                         "units_done": peer["units_done"],
                         "median_unit_seconds": statistics.median(seconds) if seconds else None,
                         "last_seen_seconds": max(0.0, now - peer["last_seen"]),
                         "refusals": stats.refusals, "banned": peer["banned"]})
        return rows

    def volunteers(self, participants: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The participants grouped by volunteer, with each one's credit, most recently seen first."""
        credit = {entry["volunteer"]: entry for entry in self.credit.table()["volunteers"]}
        profiles = self.context.store.volunteers()
        live_within = self.options.peer_timeout
        grouped: dict[str, dict[str, Any]] = {}
        for row in participants:
            who = row["identity"]
            profile = profiles.get(who, {})
            entry = grouped.setdefault(who, {
                "volunteer": who, "name": profile.get("name") or handle(who), "team": profile.get("team", ""),
                "peers": [], "workers": 0, "units_done": 0, "refusals": 0, "banned": False, "devices": [],
                "median_unit_seconds": row["median_unit_seconds"], "last_seen_seconds": row["last_seen_seconds"],
                "credit": credit.get(who, {}).get("total", 0.0), "credited_units": credit.get(who, {}).get("units", 0),
                "rank": credit.get(who, {}).get("rank")})
            entry["peers"].append(row["peer"])
            entry["workers"] += int(row["last_seen_seconds"] <= live_within and not row["banned"])
            entry["units_done"] += row["units_done"]
            entry["refusals"] += row["refusals"]
            entry["banned"] = entry["banned"] or row["banned"]
            if row["device"] and row["device"] not in entry["devices"]:
                entry["devices"].append(row["device"])
            entry["last_seen_seconds"] = min(entry["last_seen_seconds"], row["last_seen_seconds"])
            if entry["median_unit_seconds"] is None:
                entry["median_unit_seconds"] = row["median_unit_seconds"]
        return sorted(grouped.values(), key=lambda e: e["last_seen_seconds"])
