"""Round deadlines (``serve --round-deadline S --min-results M``): a mixin of ``Relay``.

A round opens when its first unit is handed out. S seconds later it merges what it has, if that is at least M
results (default: half the round's units, rounded up); otherwise it merges as soon as the M-th result comes.
The units not back are carried into the next round (``Session.complete_round(carry_missing=True)``), so each
unit is still trained once per pass and the session grows by a round now and then. Results of the round that
come while it merges without them are refused (``409 past_deadline``); their units are trained again in the
next round, from the new weights. The history says which units moved (``carried``, ``carried_in``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from server.relay.sqlite_store import Store

if TYPE_CHECKING:
    from server.session.session import Session


class RoundPacing:
    """Needs from the relay: ``session``, ``store``, ``options``, ``round_full`` and ``schedule_merge``."""

    session: Session
    store: Store
    options: Any

    if TYPE_CHECKING:
        def round_full(self) -> bool: ...

        def schedule_merge(self) -> None: ...

        def async_ready(self) -> bool: ...

    @property
    def min_results(self) -> int:
        """Results a round needs to merge at its deadline."""
        planned = len(self.session.assignments())
        wanted = getattr(self.options, "min_results", None) or -(-planned // 2)
        return max(1, min(int(wanted), planned))

    def round_opened_at(self) -> float | None:
        """When the round's first unit was handed out (its leases stay with their results)."""
        issued = [lease.issued for lease in self.store.leases(self.session.round).values()]
        return min(issued) if issued else None

    def deadline_reached(self) -> bool:
        deadline = getattr(self.options, "round_deadline", None)
        if deadline is None or self.session.done:
            return False
        opened = self.round_opened_at()
        return opened is not None and self.store.clock() - opened >= deadline and \
            len(self.store.result_slots(self.session.round)) >= self.min_results

    def round_ready(self) -> bool:
        """Whether the round may merge now: every unit is back (and checked), or its deadline passed with
        enough results."""
        if getattr(self, "async_mode", False):
            return self.async_ready()
        return self.round_full() or self.deadline_reached()

    def watch_deadline(self) -> None:
        """After the round's first hand-out: try to merge when its deadline comes (results also try)."""
        deadline = getattr(self.options, "round_deadline", None)
        if deadline is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside the app (a test): the next request checks the deadline
            return
        loop.call_later(deadline + 0.05, self.schedule_merge)

    def deadline_summary(self) -> dict[str, Any] | None:
        """The history's ``deadline`` entry when a round merged without all its units."""
        if getattr(self.options, "round_deadline", None) is None or self.round_full():
            return None
        opened = self.round_opened_at()
        return {"seconds": self.options.round_deadline, "open_seconds": self.store.clock() - opened if opened else None,
                "results": len(self.store.result_slots(self.session.round)), "min_results": self.min_results}
