"""A store's leases: granted, replaced, swapped between a unit and its second copy, released on a ban, on leaving
and after a restart; a lease keeps its peer active while the peer trains without polling."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from virtual_clock import Clock

from server.relay.store import Lease, Store, StoredResult
from server.relay.store.sql.views import SHARED_VIEW_SECONDS


def result(round_index: int, slot: int, peer_id: str, message: bytes = b"update") -> StoredResult:
    return StoredResult(round_index, slot, 10 + slot, peer_id, 256, {"loss": 0.5}, message)


def test_a_grant_is_a_lease_from_now_and_replaces_the_one_on_its_slot(store: Store, clock: Clock) -> None:
    assert store.leases(0) == {}
    lease = store.grant(0, 1, 7, "p-a", 30.0)
    assert lease == Lease(0, 1, 7, "p-a", 1000.0, 1030.0, 0)
    clock.advance(5.0)
    assert store.leases(0) == {1: lease} and store.leases(0, copy=1) == {} and store.leases(1) == {}
    assert store.grant(0, 1, 7, "p-b", 30.0) is None  # (p-a's lease is live: it stays)
    renewed = store.grant(0, 1, 7, "p-a", 30.0)  # (its own peer may take it again)
    assert renewed is not None and renewed.issued == 1005.0 and store.leases(0) == {1: renewed}
    copy = store.grant(0, 1, 7, "p-c", 10.0, copy=1)
    assert copy is not None and store.leases(0, copy=1) == {1: copy} and copy.copy == 1
    clock.advance(31.0)  # (both ran out)
    again = store.grant(0, 1, 7, "p-b", 30.0)
    assert again is not None and store.leases(0) == {1: again} and again.peer_id == "p-b" and again.issued == 1036.0
    clock.advance(100.0)
    assert store.leases(0) == {1: again}  # (expired leases are still listed: the caller judges the deadline)


def test_two_relays_over_one_store_never_lease_a_unit_twice(store: Store, second_look: Callable[[], Store],
                                                             clock: Clock) -> None:
    """Another relay on the same database (a second store object: its own connection and what it keeps) asks
    for the same units: the database gives each live lease to one peer, and a relay that lost reads the round
    again."""
    other = second_look()
    assert other.leases(0) == {}  # (read, and kept, before the first relay's grants)
    mine = [store.grant(0, slot, slot, "p-a", 30.0) for slot in range(3)]
    assert all(lease is not None for lease in mine)
    assert [other.grant(0, slot, slot, "p-b", 30.0) for slot in range(3)] == [None, None, None]
    assert other.leases(0) == {lease.slot: lease for lease in mine if lease is not None}
    assert other.grant(0, 3, 3, "p-b", 30.0) is not None and store.grant(0, 3, 3, "p-a", 30.0) is None
    assert store.grant(0, 0, 0, "p-b", 10.0, copy=1) is not None  # (a second copy is its own lease)
    assert other.grant(0, 0, 0, "p-c", 10.0, copy=1) is None
    clock.advance(31.0)
    taken = other.grant(0, 1, 1, "p-b", 30.0)  # (p-a's ran out: the unit goes on)
    assert taken is not None and store.leases(0)[1].peer_id == "p-b"
    assert store.grant(0, 1, 1, "p-a", 30.0) is None


def test_release_drops_a_slot_or_one_peers_lease_on_it(store: Store) -> None:
    store.grant(0, 0, 1, "p-a", 30.0)
    store.grant(0, 0, 1, "p-b", 30.0, copy=1)
    store.grant(0, 1, 2, "p-a", 30.0)
    store.release(0, 0, "p-b")
    assert set(store.leases(0)) == {0, 1} and store.leases(0, copy=1) == {}
    store.release(0, 0)
    assert set(store.leases(0)) == {1}
    store.release(5, 5)  # (nothing there: no error)


def test_swapping_copies_makes_the_second_copy_the_units_own(store: Store) -> None:
    own = store.grant(0, 2, 5, "p-a", 30.0)
    second = store.grant(0, 2, 5, "p-b", 30.0, copy=1)
    store.swap_copies(0, 2)
    assert store.leases(0)[2].peer_id == "p-b" and store.leases(0, copy=1)[2].peer_id == "p-a"
    assert store.leases(0)[2].deadline == second.deadline and store.leases(0, copy=1)[2].issued == own.issued
    store.swap_copies(0, 3)  # (no leases there: no error)


def test_a_banned_peer_loses_its_live_leases_only(store: Store, clock: Clock) -> None:
    store.grant(0, 0, 1, "p-a", 10.0)
    store.grant(0, 1, 2, "p-a", 60.0)
    store.grant(0, 2, 3, "p-b", 60.0)
    clock.advance(30.0)
    assert store.release_leases_of("p-a") == 1  # (slot 0's lease had run out)
    assert set(store.leases(0)) == {0, 2}
    assert store.release_leases_of("p-nobody") == 0


def test_leaving_drops_live_leases_and_counts_the_undelivered(store: Store, clock: Clock) -> None:
    peer_id, _ = store.add_peer()
    store.grant(0, 0, 1, peer_id, 60.0)
    store.grant(0, 1, 2, peer_id, 60.0)
    store.grant(0, 2, 3, peer_id, 60.0, copy=1)
    store.grant(0, 3, 4, peer_id, 5.0)
    store.add_result(result(0, 0, peer_id))
    clock.advance(10.0)
    assert store.active_peers(1.0) == [peer_id]  # (holding live leases, though not seen for 10 s)
    assert store.release_leases_on_leaving(peer_id) == 2  # slot 1, and the copy on slot 2; slot 0 is delivered
    assert set(store.leases(0)) == {3} and store.leases(0, copy=1) == {}  # (slot 3's had run out: it stays)
    assert store.active_peers(1.0) == []


def test_a_restart_keeps_only_the_leases_of_delivered_units(store: Store) -> None:
    store.grant(0, 0, 1, "p-a", 60.0)
    store.grant(0, 0, 1, "p-b", 60.0, copy=1)
    store.grant(0, 1, 2, "p-c", 60.0)
    store.grant(1, 0, 3, "p-d", 60.0)
    store.add_result(result(0, 0, "p-a"))
    assert store.release_live_leases() == 3
    assert set(store.leases(0)) == {0} and store.leases(0, copy=1) == {} and store.leases(1) == {}


def test_the_leases_read_are_what_the_file_holds_after_every_kind_of_change(store: Store, clock: Clock,
                                                                             tmp_path: Path) -> None:
    """The SQLite store keeps the leases it read (every request for work reads them): after each change, what it
    returns is what a store opened fresh on the same file reads, and a caller changing the dict it got changes
    nothing."""
    from server.relay.store import open_store

    def fresh() -> dict[int, dict[int, Lease]]:
        other = open_store(tmp_path / "relay.sqlite3", clock=clock)
        try:
            return {copy: other.leases(0, copy) for copy in (0, 1)}
        finally:
            other.close()

    def same() -> None:
        assert {copy: store.leases(0, copy) for copy in (0, 1)} == fresh()

    if not (tmp_path / "relay.sqlite3").exists():
        return  # (another implementation: nothing to compare with)
    for slot in range(4):
        store.grant(0, slot, slot, f"p-{slot}", 30.0)
        same()
    store.grant(0, 2, 2, "p-copy", 30.0, copy=1)
    same()
    store.leases(0)[0] = Lease(0, 0, 0, "p-forged", 0.0, 0.0, 0)
    same()
    store.swap_copies(0, 2)
    same()
    store.release(0, 3)
    same()
    store.grant(0, 3, 3, "p-3", 30.0)
    store.grant(0, 3, 3, "p-3b", 30.0, copy=1)
    same()
    store.release(0, 3, "p-3b")  # (one peer's lease on the slot: the other copy's stays, and the kept views know it)
    same()
    store.release(0, 3, "p-nobody")
    same()
    store.release(0, 3, "p-3")
    same()
    store.add_result(result(0, 1, "p-1"))
    assert store.release_leases_on_leaving("p-0") == 1
    same()
    store.release_leases_of("p-copy")
    same()
    store.grant(0, 3, 3, "p-x", 30.0)
    store.remove_results_of("p-x", 0)
    same()
    store.grant(0, 0, 0, "p-y", 30.0)
    store.reset_round(0)
    same()
    store.grant(0, 0, 0, "p-z", 30.0)
    assert store.release_live_leases() == 1
    same()
    store.close()
    other = open_store(tmp_path / "relay.sqlite3", clock=clock)
    other.grant(0, 2, 2, "p-while-closed", 30.0)
    other.close()
    store.open()
    same()


def test_a_lease_of_the_stream_keeps_its_version_and_is_never_granted_after_its_result(
        store: Store, second_look: Callable[[], Store], clock: Clock) -> None:
    """The asynchronous stream's leases (round -1) say which weights version the unit went out with, for whichever
    relay the result reaches; an entry whose result arrived is not leased again, by this relay or another one that
    read the leases before (its lease ran out meanwhile)."""
    other = second_look()
    assert other.leases(-1) == {} and other.arrived_entries() == set()  # (read, and kept, before what follows)
    granted = store.grant(-1, 4, 9, "p-a", 10.0, version=3)
    assert granted is not None and granted.version == 3
    assert other.lease(-1, 4) == granted and other.lease(-1, 5) is None  # (read afresh, never from what is kept)
    store.add_arrival(entry=4, unit_index=9, peer_id="p-a", version=3, num_examples=1, metrics={}, message=b"m",
                      update=b"")
    clock.advance(11.0)
    assert other.grant(-1, 4, 9, "p-b", 10.0, version=5) is None
    assert store.grant(-1, 4, 9, "p-a", 10.0, version=5) is None  # (its own peer either)
    assert store.lease(-1, 4) == granted
    again = other.grant(-1, 5, 10, "p-b", 10.0, version=5)
    assert again is not None and store.lease(-1, 5) == again and store.leases(-1)[5].version == 5
    assert store.grant(0, 4, 9, "p-c", 10.0) is not None  # (a round's slot 4 is another lease: rounds ignore arrivals)


def test_a_shared_store_reads_again_what_another_relay_changed(store: Store, second_look: Callable[[], Store],
                                                              clock: Clock) -> None:
    """A store that other relays write (``shared``: PostgreSQL's; a SQLite store object told so here) keeps what it
    read for ``SHARED_VIEW_SECONDS`` of its clock at most: then the other relay's leases, results and arrivals show,
    and its generation moves on."""
    other = second_look()
    other.shared = True  # type: ignore[misc]  # (a SQLite store is shared by no one unless told)
    assert other.leases(0) == {} and other.result_slots(0) == set() and other.buffered_count() == 0
    generation = other.generation()
    lease = store.grant(0, 1, 1, "p-a", 30.0)
    store.add_result(StoredResult(0, 1, 1, "p-a", 8, {}, b"result"))
    store.add_arrival(entry=0, unit_index=0, peer_id="p-a", version=0, num_examples=1, metrics={}, message=b"m",
                      update=b"")
    clock.advance(SHARED_VIEW_SECONDS)
    assert other.leases(0) == {1: lease} and other.result_slots(0) == {1}
    assert other.buffered_count() == 1 and other.arrived_entries() == {0} and other.generation() > generation


def test_the_lease_epoch_moves_on_every_change_to_the_leases_but_the_stores_own_grants(
        store: Store, second_look: Callable[[], Store], clock: Clock) -> None:
    """What the async stream derives from every lease (server.relay.stream_order) holds, its own grants added, until
    the epoch moves: a release, a peer's leases going, a reset, a shared store's re-read of what others wrote. A lease
    as kept is the one ``leases`` lists."""
    epoch = store.lease_epoch()
    first = store.grant(-1, 0, 0, "p-a", 10.0)
    second = store.grant(-1, 1, 1, "p-b", 10.0)
    assert store.lease_epoch() == epoch  # (its own grants: the caller adds them itself)
    assert store.kept_lease(-1, 0) == first and store.kept_lease(-1, 1) == second and store.kept_lease(-1, 2) is None
    store.release(-1, 0)
    assert store.lease_epoch() > epoch and store.kept_lease(-1, 0) is None and store.leases(-1) == {1: second}
    epoch = store.lease_epoch()
    assert store.release_leases_of("p-b") == 1 and store.lease_epoch() > epoch and store.kept_lease(-1, 1) is None
    other = second_look()
    other.shared = True  # type: ignore[misc]  # (a SQLite store is shared by no one unless told)
    assert other.kept_lease(-1, 3) is None  # (read, and kept)
    epoch = other.lease_epoch()
    third = store.grant(-1, 3, 3, "p-c", 10.0)
    assert other.kept_lease(-1, 3) is None and other.lease_epoch() == epoch  # (kept: not read again yet)
    clock.advance(SHARED_VIEW_SECONDS)
    assert other.lease_epoch() > epoch and other.kept_lease(-1, 3) == third
