"""The relay's store: what every part of the relay may ask of the session's state, whichever database keeps it.

``Store`` is the interface the relay's parts type against; it is the union of one small protocol per concept
(peers, leases, results, second copies, the asynchronous buffer, bans, undos, the host's pause, counters, and
opening and closing),
so an implementation can be read, written and tested one concept at a time.

The contract every implementation keeps:
- **Thread safety and atomicity.** Any method may be called from any thread (the merge runs in a worker thread,
  replays in a pool). Each call is one transaction: other calls see all of its writes or none, and a crash leaves
  all or none of them.
- **Time.** Every timestamp written, and every "within ``seconds``" window, is read from ``clock`` (a simulator
  runs a virtual one).
- **Absence.** Asking about a peer, round, slot or entry the store does not hold is no error: each method says
  what it returns then (None, an empty collection, 0, False, "").
- **Closed.** After ``close`` every method that reads or writes the session's state raises, until ``open``.
- **A full disk.** A write that finds no room raises the database's own error (SQLite: ``sqlite3.OperationalError``,
  "database or disk is full"); ``server.relay.storage`` turns it into 503 ``disk_full``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from server.relay.store.arrival_concepts import ArrivalStore
from server.relay.store.concepts import (
    BanStore,
    CopyStore,
    CounterStore,
    ForwardStore,
    LeaseStore,
    PauseStore,
    PeerStore,
    RefusalStore,
    ReplayJobStore,
    ResultStore,
    UndoStore,
    VolunteerStore,
    WantedCopyStore,
)
from server.relay.store.records import Lease


class StoreLifecycle(Protocol):
    @property
    def clock(self) -> Callable[[], float]:
        """What "now" is for leases, results and peers."""

    @property
    def path(self) -> Path | None:
        """The file where the store keeps its bytes on this machine (the session's disk use counts them apart);
        None for a database server's."""

    @property
    def location(self) -> str:
        """Where it was opened: its file's path, or its database's URL (``open_store`` of it opens this store
        again, the same data; a URL's password is in it, so it is never logged)."""

    @property
    def closed(self) -> bool: ...

    # Whether other relays may write the store while this one serves (a database server's): what the store keeps of
    # its rows then lasts a fraction of a second (``generation`` moves on as it goes).
    shared: bool

    def open(self) -> None:
        """Connect (again, after ``close``; nothing when open); creates what a new store lacks and brings an older
        one up to date, keeping its data."""

    def close(self) -> None:
        """Disconnect (nothing when closed); the data stays for the next ``open``."""

    def disk_bytes(self) -> int:
        """Bytes the store takes on this machine's disk (0 for one kept elsewhere)."""

    def generation(self) -> int:
        """A number that moves on whenever peers (joining, leaving, coming back), leases, results, copies or bans
        change, but not at a peer's touch: what a relay derives from them at one generation holds until it moves or
        the clock passes a deadline (a thousand polls a second then read the store once per change)."""

    def kept_lease(self, round_index: int, slot: int, copy: int = 0) -> Lease | None:
        """One lease as ``leases`` has it (what the store keeps, without copying every lease of the round)."""

    def lease_epoch(self) -> int:
        """A number that moves on whenever the leases change other than by this store's own grants (a release, a round
        reset, a shared store's re-read of what others wrote): what a relay derives from every lease holds, its own
        grants added, until it moves or a deadline passes."""


class Store(StoreLifecycle, PeerStore, LeaseStore, ResultStore, CopyStore, ArrivalStore, BanStore, UndoStore,
            ReplayJobStore, VolunteerStore, PauseStore, RefusalStore, WantedCopyStore, ForwardStore,
            CounterStore, Protocol):
    """The relay's session state: peers, leases, every accepted result and copy, the asynchronous buffer, bans,
    undos, the host's pause and counters (the contract is in this module's docstring). Open one with
    ``server.relay.store.open_store``."""


# Each concept's protocol, for a test that checks an implementation concept by concept.
CONCEPTS: tuple[type, ...] = (StoreLifecycle, PeerStore, LeaseStore, ResultStore, CopyStore, ArrivalStore, BanStore,
                              UndoStore, ReplayJobStore, VolunteerStore, PauseStore, RefusalStore,
                              WantedCopyStore, ForwardStore, CounterStore)
