"""What every part of the relay shares: the session being served (``RelayContext``) and the notices that wake
held requests and the page's event streams (``Notices``).

The relay (``server.relay.state.Relay``) owns one of each and hands them to its parts when it builds them. A new
session (the admin API's, or the last checkpoint reloaded after a full disk) replaces ``session`` and ``store`` in
place, so every part sees it at once; what a part keeps of its own is its business.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from server.relay.options import RelayOptions
from server.relay.store import Store
from server.session.package import Package
from server.session.session import Session


@dataclass
class Notices:
    """Two kinds of news. ``changed``: anything the page shows moved (the status's ``version`` goes up, event
    streams send it). ``work_changed``: something that can turn a "wait" into work happened (a round opened, a
    peer joined, a slot was freed, an admin action): held ``POST /api/work?hold=S`` requests wake. Lease expiry
    wakes nobody; holders see it when their hold ends (or at the next backup, ``Relay.work``)."""

    version: int = 0
    holding: int = 0  # held work requests waiting now
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _work: asyncio.Event = field(default_factory=asyncio.Event)
    _turns: int | None = None  # held requests the last ``work_changed`` lets look for work (None: every one)
    _woken: int = 0  # held requests the last ``work_changed`` woke that have not answered nor held on again
    _settled: asyncio.Event = field(default_factory=asyncio.Event)

    def changed(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def work_changed(self, *, available: int | None = None) -> None:
        """Wake the held requests. ``available``: how many units the change made (a round that opened with k): only
        that many of the woken look for work, the rest hold on. A thousand held requests that all look for a
        hundred units cost the relay a thousand searches a round, on its one event loop."""
        self._turns = available
        self._woken = self.holding  # (each of them wakes, and answers or holds on: ``woken_done``)
        self._settled = asyncio.Event()
        if not self._woken:
            self._settled.set()
        self._work.set()
        self._work = asyncio.Event()
        self.changed()

    def woken_done(self) -> None:
        """A request the last ``work_changed`` woke has its answer, or holds on."""
        if self._woken > 0:
            self._woken -= 1
            if not self._woken:
                self._settled.set()

    async def woken_answered(self, seconds: float) -> bool:
        """Until every request the last ``work_changed`` woke has its answer or holds on again (True), or
        ``seconds`` (False: one was cancelled, say). What the relay waits for after opening a round before it
        starts anything that competes with those answers for the interpreter (the page's samples)."""
        if self._settled.is_set():
            return True
        try:
            await asyncio.wait_for(self._settled.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            return False
        return True

    def take_turn(self) -> bool:
        """A held request woke: whether it looks for work now (the last ``work_changed``'s turns are not all taken)."""
        if self._turns is None:
            return True
        if self._turns <= 0:
            return False
        self._turns -= 1
        return True

    @property
    def work_generation(self) -> asyncio.Event:
        """The event the next ``work_changed`` sets: a driver without an event loop (the virtual-clock
        simulator) compares it with the one it saw last to know that held peers would have woken."""
        return self._work

    async def wait_for_change(self, seconds: float) -> bool:
        """Until the next ``changed`` (True) or ``seconds`` (False): what an event stream waits on."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            return False
        return True

    async def hold_for_work(self, seconds: float) -> bool:
        """Return after ``work_changed`` (True) or ``seconds`` (False), whichever comes first."""
        self.holding += 1
        try:
            await asyncio.wait_for(self._work.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            return False
        finally:
            self.holding -= 1
        return True


@dataclass
class RelayContext:
    """The session a relay serves, its package, its SQLite store, the relay's options and its notices."""

    session: Session
    package: Package
    store: Store
    options: RelayOptions
    notices: Notices = field(default_factory=Notices)
    merging: bool = False  # a merge runs: no hand-out in sync mode, and a result of a slot without one is refused
    replica: bool = False  # another relay holds the session and merges; this one hands out and takes results

    @property
    def async_mode(self) -> bool:
        return self.session.config.mode == "async"


class Part:
    """A part of the relay that reads the served session, its store and the options through the shared context
    (they change in place when a new session is served)."""

    context: RelayContext

    @property
    def session(self) -> Session:
        return self.context.session

    @property
    def store(self) -> Store:
        return self.context.store

    @property
    def options(self) -> RelayOptions:
        return self.context.options
