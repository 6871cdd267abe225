"""Credit for verified work (``Credit``, a part of the relay): what each volunteer gave, counted by the relay.

A unit's credit is its training compute as the relay counts it from the task's model and the unit itself
(``Task.unit_flops``: about 6 FLOPs per weight per example or token trained), in GFLOP: one credit is 10^9
floating-point operations of training. A peer's claims count for nothing: the example count is the relay's own.

Credit is granted once the unit's verification has settled, and read from the store each time rather than added up,
so what a ban undoes is taken back by itself:
- a result of a merged round whose replay passed or whose copy agreed counts at once;
- any other result of a merged round counts once the next round has merged too (a routine replay of round r is
  judged before round r + 1 merges, so by then nothing is left to challenge it), or the session is done;
- a result undone after its peer's ban, or of a peer banned now, counts for nothing (lifting the ban gives back
  what stayed merged); an asynchronous session's results count once merged.

Per volunteer (a page's key, ``server.relay.volunteers``; a peer without one counts on its own): the total, a recent
average as BOINC keeps it (credit per day, each grant decaying with a half-life of ``HALF_LIFE_DAYS``, dated by when
its result came), the units, the workers connected now and the rank by total; per team the same summed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from runtime.tasks import Task, TaskError, WorkUnit
from server.relay.context import Part, RelayContext

GFLOP = 1e9  # FLOPs per credit
HALF_LIFE_DAYS = 7.0  # of the recent average (BOINC's)
UNIT_TEXT = "GFLOP of training (10^9 floating-point operations), counted by the relay from the model and the unit"
SETTLED = ("replay passed", "agreed")
TOP = 20  # volunteers and teams /api/credit lists
REFRESH_SECONDS = 5.0  # the status's leaderboard is at most this old (or the round's: a merge refreshes it)


def handle(volunteer: str) -> str:
    """An anonymous volunteer's name on the page: short, stable, not its whole key digest."""
    return ("volunteer-" if not volunteer.startswith("p-") else "peer-") + volunteer.removeprefix("p-")[:6]


class Credit(Part):
    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self._flops: dict[tuple[str, int, int], float] = {}  # (package, unit index, examples) -> FLOPs
        self._cached: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def unit_credit(self, unit_index: int, examples: int) -> float:
        package = self.context.package
        key = (package.fingerprint, unit_index, examples)
        if key not in self._flops:
            task = package.task
            try:
                self._flops[key] = task.unit_flops(task.work_unit(package.data, unit_index, seed=0), examples)
            except TaskError:  # (a task's own count that needs what the host lacks: the base rule on its examples)
                self._flops[key] = Task.unit_flops(task, WorkUnit(index=unit_index, seed=0), examples)
        return self._flops[key] / GFLOP

    def grants(self) -> list[tuple[str, float, float]]:
        """(volunteer or peer, credit, when its result came) of every settled result."""
        session = self.session
        results, arrivals = self.store.credit_rows()
        merged_below = session.round  # rounds before the open one are merged (sync); async: ``merge`` is set
        granted = []
        for round_index, _slot, unit, peer, volunteer, examples, verification, received, banned in results:
            if banned or verification.startswith("undone") or round_index >= merged_below:
                continue
            if not (session.done or round_index + 1 < merged_below or any(s in verification for s in SETTLED)):
                continue
            granted.append((volunteer or peer, self.unit_credit(unit, examples), received))
        for _merge, unit, peer, volunteer, examples, received, banned in arrivals:
            if not banned:
                granted.append((volunteer or peer, self.unit_credit(unit, examples), received))
        return granted

    def table(self, now: float | None = None, *, fresh: bool = False) -> dict[str, Any]:
        """Every volunteer's and team's credit, ranked: as of the store's last change when ``fresh`` (``GET
        /api/credit``), else as of the round's last merge or ``REFRESH_SECONDS`` ago (the status, which a crowd's
        every change rebuilds: reading every result row each time would cost more than the change)."""
        now = self.store.clock() if now is None else now
        key = (self.store.generation() if fresh else int(now // REFRESH_SECONDS), self.session.round,
               self.session.done)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        decay = math.log(2) / (HALF_LIFE_DAYS * 86400.0)
        total: dict[str, float] = defaultdict(float)
        recent: dict[str, float] = defaultdict(float)
        units: dict[str, int] = defaultdict(int)
        for who, credit, received in self.grants():
            total[who] += credit
            recent[who] += credit * decay * 86400.0 * math.exp(-decay * max(0.0, now - received))
            units[who] += 1
        profiles = self.store.volunteers()
        live = set(self.store.active_peers(self.options.peer_timeout))
        workers: dict[str, int] = defaultdict(int)
        for peer in live:
            workers[self.store.identity(peer)] += 1
        people = []
        for rank, who in enumerate(sorted(total, key=lambda w: (-total[w], w)), start=1):
            profile = profiles.get(who, {})
            people.append({"rank": rank, "volunteer": who, "name": profile.get("name") or handle(who),
                           "named": bool(profile.get("name")), "team": profile.get("team", ""),
                           "total": total[who], "recent_average": recent[who], "units": units[who],
                           "workers": workers.get(who, 0)})
        teams: dict[str, dict[str, Any]] = {}
        for person in people:
            if person["team"]:
                team = teams.setdefault(person["team"], {"team": person["team"], "total": 0.0, "recent_average": 0.0,
                                                         "units": 0, "volunteers": 0})
                for field in ("total", "recent_average", "units"):
                    team[field] += person[field]
                team["volunteers"] += 1
        ranked_teams = [{"rank": rank} | team for rank, team in
                        enumerate(sorted(teams.values(), key=lambda t: (-t["total"], t["team"])), start=1)]
        built = {"unit": UNIT_TEXT, "half_life_days": HALF_LIFE_DAYS, "total": sum(total.values()),
                 "volunteers": people, "teams": ranked_teams}
        self._cached = (key, built)
        return built

    def board(self, *, top: int = TOP, volunteer: str | None = None) -> dict[str, Any]:
        """The leaderboard (``GET /api/credit``): the top volunteers and teams, and ``volunteer``'s own entry."""
        table = self.table(fresh=True)
        you = next((p for p in table["volunteers"] if p["volunteer"] == volunteer), None) if volunteer else None
        return {**table, "volunteers": table["volunteers"][:top], "teams": table["teams"][:top], "you": you,
                "count": len(table["volunteers"])}
