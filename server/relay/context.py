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
    _work: asyncio.Event = field(default_factory=asyncio.Event)  # (set by every ``work_changed``: its generation)
    _held: dict[int, asyncio.Future[None]] = field(default_factory=dict)  # the held requests, longest held first
    _holds: int = 0  # held requests ever (their keys in ``_held``)
    _woken: int = 0  # held requests the last ``work_changed`` woke that have not answered nor held on again
    _settled: asyncio.Event = field(default_factory=asyncio.Event)

    def changed(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def work_changed(self, *, available: int | None = None) -> None:
        """Wake held requests: ``available`` of them, the longest held first (how many units the change made: a
        round that opened with k, an arrival whose copy may go out), or every one (None). A wake costs the requests
        it wakes, not every one held: at 10,000 peers each arrival waiting for its copy woke all of them (each to
        find no turn and hold on again), 30 % of the relay's event loop."""
        limit = len(self._held) if available is None else available
        woken = 0
        while self._held and woken < limit:
            waiter = self._held.pop(next(iter(self._held)))
            if not waiter.done():  # (one whose hold ended goes at its own pace)
                waiter.set_result(None)
                woken += 1
        self._woken = woken  # (each of them answers, or holds on: ``woken_done``)
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
        """Return when a ``work_changed`` wakes this request (True) or after ``seconds`` (False), whichever comes
        first."""
        key, self._holds = self._holds, self._holds + 1
        waiter = self._held[key] = asyncio.get_running_loop().create_future()
        self.holding += 1
        try:
            await asyncio.wait_for(waiter, timeout=max(seconds, 0.0))
        except TimeoutError:
            return waiter.done() and not waiter.cancelled()  # (woken as its hold ended: it has its turn)
        finally:
            self.holding -= 1
            self._held.pop(key, None)
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
