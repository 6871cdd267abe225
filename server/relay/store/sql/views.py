"""What ``SQLStore`` keeps of the rows it read (``KeptViews``), and when it forgets them.

Every request for work reads the open round's leases, which slots have a result, the copies' outcomes and who is
active; at a thousand peers a round, that is a thousand rows read a thousand times (a round's hand-out took
seconds). So the store keeps them as read: a change it makes itself forgets them (a grant updates the leases kept
instead), and ``generation`` moves on, so what a relay derives from them holds until then. One relay process is
the only writer while it serves. A ``shared`` store (PostgreSQL's: relays serving one session together write it
too) also forgets them once they are ``SHARED_VIEW_SECONDS`` old on its clock: what must be exact is decided by the
database in one statement (a grant, an arrival) or read afresh (``lease``, ``has_arrived``), never from these."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from server.relay.store.records import Lease, PendingUndo

CACHE_ROUNDS = 8  # rounds (of leases: (round, copy)) whose rows are kept; past that all are forgotten
SHARED_VIEW_SECONDS = 0.25  # a ``shared`` store reads what it keeps again after this long (others write too)


class KeptViews:
    """The views and their lock; ``forget``: what else the store keeps (the arrivals' part), forgotten with them."""

    shared = False

    def __init__(self, clock: Callable[[], float], *, forget: Callable[[], None]) -> None:
        self._clock, self._forget_more = clock, forget
        self._lease_cache: dict[tuple[int, int], dict[int, Lease]] = {}  # (round, copy) -> the rows, as read
        self._cache_lock = threading.RLock()
        self._copies_cache: dict[int, dict[tuple[int, str], str]] = {}  # round -> its copies' outcomes, as read
        self._active: tuple[float, float, list[str], frozenset[str]] | None = None  # (read at, within, ids, as a set)
        self._slots_cache: dict[int, dict[int, str]] = {}  # round -> who delivered each slot's result, as read
        self._refusals_cache: dict[int, dict[int, frozenset[str]]] = {}  # round -> the peers refused on each slot
        self._generation = 0  # (``generation``: every change but a peer's touch moves it on)
        self._views_read_at = clock()  # (a shared store: when what it keeps was last forgotten, the store's clock)
        self._lease_epoch = 0  # (``lease_epoch``: every change to the leases but this store's own grants)
        self._pause: tuple[bool, int | None] | None = None  # (the host's pause, as read: every ask reads it)
        self._bans_cache: dict[str, str] | None = None  # (every ban's reason, as read: each copy's hand-out asks)
        self._undos_cache: list[PendingUndo] | None = None  # (the undos not done, as read: each result asks)

    def generation(self) -> int:
        self._expire()
        return self._generation

    def lease_epoch(self) -> int:
        self._expire()
        return self._lease_epoch

    def _expire(self) -> None:
        """A shared store forgets what it keeps once it is ``SHARED_VIEW_SECONDS`` old (others change it too)."""
        if not self.shared or 0 <= self._clock() - self._views_read_at < SHARED_VIEW_SECONDS:
            return
        with self._cache_lock:
            self._lease_cache.clear()
            self._copies_cache.clear()
            self._slots_cache.clear()
            self._refusals_cache.clear()
            self._active = None
            self._pause = None
            self._bans_cache, self._undos_cache = None, None
            self._forget_more()
            self._generation += 1
            self._lease_epoch += 1
            self._views_read_at = self._clock()

    def _forget_active(self, *, unless: str | None = None) -> None:
        """Forget the active peers kept (``unless``: not when that peer is among them)."""
        with self._cache_lock:
            if unless is None or self._active is None or unless not in self._active[3]:
                self._active = None
                self._generation += 1  # (who is active changed; a touch of an active peer changes nothing)

    def _kept(self, cache: dict[Any, dict[Any, Any]], key: Any, read: Callable[[], dict[Any, Any]]) -> dict[Any, Any]:
        """A copy of ``cache[key]``, read first where it is not kept (past ``CACHE_ROUNDS`` keys, all are forgotten)."""
        with self._cache_lock:
            return dict(self._kept_itself(cache, key, read))

    def _kept_itself(self, cache: dict[Any, dict[Any, Any]], key: Any,
                     read: Callable[[], dict[Any, Any]]) -> dict[Any, Any]:
        """``cache[key]`` itself, read first where it is not kept: for a lookup under the lock, never handed out."""
        with self._cache_lock:
            cached = cache.get(key)
            if cached is None:
                if len(cache) >= CACHE_ROUNDS:
                    cache.clear()
                cached = cache[key] = read()
            return cached

    def _granted(self, lease: Lease | None, round_index: int, copy: int, peer_id: str) -> None:
        """After a grant (under the lock): the leases kept take it; a refused one (another relay leased the unit, or
        took its result) has the round's leases and the arrivals read again."""
        self._generation += 1
        if lease is None:
            self._lease_cache.pop((round_index, copy), None)
            self._forget_more()
            self._forget_active()
            return
        self._forget_active(unless=peer_id)
        cached = self._lease_cache.get((round_index, copy))
        if cached is not None:
            cached[lease.slot] = lease

    @contextlib.contextmanager
    def _changing(self, *caches: dict[Any, Any], active: bool = False, leases: bool = False) -> Iterator[None]:
        """Around a change to what ``caches`` keep (and, with ``active``, who is active; with ``leases``, the leases):
        they are forgotten once it is done, and the generation (and the lease epoch) moves on."""
        with self._cache_lock:
            try:
                yield
            finally:
                for cache in caches:
                    cache.clear()
                if active:
                    self._active = None
                self._generation += 1
                if leases:
                    self._lease_epoch += 1

    @contextlib.contextmanager
    def _releasing(self, going: Callable[[tuple[int, int], dict[int, Lease]], list[int]]) -> Iterator[None]:
        """Around a delete from the leases table of the rows ``going`` names (the slots of each kept view, by (round,
        copy), whose rows go): the leases kept lose those rows instead of being read again (every upload releases its
        lease, a ban or a peer leaving its peer's: a crowd's next request for work read a thousand rows after each);
        the rest of what ``_changing_leases`` forgets is forgotten."""
        with self._cache_lock:
            kept = dict(self._lease_cache)
            with self._changing_leases():
                yield
            for key, view in kept.items():
                for slot in going(key, view):
                    del view[slot]
                self._lease_cache[key] = view

    def _changing_leases(self) -> contextlib.AbstractContextManager[None]:
        """Around any change to the leases table but a grant (the copies, results and refusals kept go too)."""
        return self._changing(self._lease_cache, self._copies_cache, self._slots_cache, self._refusals_cache,
                              active=True, leases=True)

    def _changing_results(self) -> contextlib.AbstractContextManager[None]:
        return self._changing(self._slots_cache)

    def _changing_copies(self) -> contextlib.AbstractContextManager[None]:
        return self._changing(self._copies_cache)
