"""Round deadlines (``serve --round-deadline S --min-results M``): ``RoundPacing``, a part of the relay.

A round opens when its first unit is handed out. S seconds later it merges what it has, if that is at least M
results (default: half the round's units, rounded up); otherwise it merges as soon as the M-th result comes.
The units not back are carried into the next round (``Session.complete_round(carry_missing=True)``), so each
unit is still trained once per pass and the session grows by a round now and then. Results of the round that
come while it merges without them are refused (``409 past_deadline``); their units are trained again in the
next round, from the new weights. The history says which units moved (``carried``, ``carried_in``).

This part only reads the clock and the store; the relay decides when to merge (``Relay.round_ready``) and arms a
timer for the deadline where it runs on an event loop.
"""

from __future__ import annotations

from typing import Any

from server.relay.context import RelayContext


class RoundPacing:
    def __init__(self, context: RelayContext) -> None:
        self.context = context

    @property
    def deadline(self) -> float | None:
        """Seconds after its first hand-out a round merges what it has (None: no deadline)."""
        return self.context.options.round_deadline

    @property
    def min_results(self) -> int:
        """Results a round needs to merge at its deadline."""
        planned = len(self.context.session.assignments())
        wanted = self.context.options.min_results or -(-planned // 2)
        return max(1, min(int(wanted), planned))

    def round_opened_at(self) -> float | None:
        """When the round's first unit was handed out (its leases stay with their results)."""
        issued = [lease.issued for lease in self.context.store.leases(self.context.session.round).values()]
        return min(issued) if issued else None

    def deadline_reached(self) -> bool:
        session, store = self.context.session, self.context.store
        if self.deadline is None or session.done:
            return False
        opened = self.round_opened_at()
        return opened is not None and store.clock() - opened >= self.deadline and \
            len(store.result_slots(session.round)) >= self.min_results

    def deadline_summary(self, *, round_full: bool) -> dict[str, Any] | None:
        """The history's ``deadline`` entry when a round merged without all its units."""
        if self.deadline is None or round_full:
            return None
        opened, store = self.round_opened_at(), self.context.store
        return {"seconds": self.deadline, "open_seconds": store.clock() - opened if opened else None,
                "results": len(store.result_slots(self.context.session.round)), "min_results": self.min_results}
