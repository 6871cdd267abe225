"""A store's asynchronous buffer: results in arrival order, marked by the merge that took them, put back when a
checkpoint lacks that merge, pruned once merged."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest

from server.relay.store import AlreadyArrived, Store
from server.relay.store.records import ASYNC_ROUND


def arrive(store: Store, entry: int, peer_id: str = "p-a", version: int = 0) -> int:
    return store.add_arrival(entry=entry, unit_index=10 + entry, peer_id=peer_id, version=version, num_examples=256,
                             metrics={"loss": entry}, message=b"message %d" % entry, update=b"update %d" % entry)


def test_arrivals_wait_in_order_until_merged(store: Store) -> None:
    peer_id, _ = store.add_peer()
    assert store.buffered() == [] and store.buffered_count() == 0 and store.arrived_entries() == set()
    seqs = [arrive(store, entry, peer_id, version=1) for entry in (4, 2, 7)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert store.arrived_entries() == {2, 4, 7} and store.buffered_count() == 3
    assert store.arrived_count() == 3 and store.arrived(4) and not store.arrived(3)
    assert store.buffered() == [(seqs[0], 4, 14, 1, 256, {"loss": 4}, b"update 4", b"message 4"),
                                (seqs[1], 2, 12, 1, 256, {"loss": 2}, b"update 2", b"message 2"),
                                (seqs[2], 7, 17, 1, 256, {"loss": 7}, b"update 7", b"message 7")]
    assert store.buffered(2) == store.buffered()[:2] and [row[0] for row in store.buffered(1)] == seqs[:1]
    assert store.peers_listing()[0]["units_done"] == 3
    assert store.arrivals() == []  # (none merged)
    store.mark_merged(seqs[:2], 0)
    assert [row[0] for row in store.buffered()] == [seqs[2]] and store.buffered_count() == 1
    assert store.arrivals() == [(seqs[0], 4, 14, 1, 0, 256, {"loss": 4}, b"message 4"),
                                (seqs[1], 2, 12, 1, 0, 256, {"loss": 2}, b"message 2")]
    assert store.arrived_entries() == {2, 4, 7}


def test_an_entry_arrives_once(store: Store, second_look: Callable[[], Store]) -> None:
    """Another relay on the same database (a second store object, which read the entries before) is refused the
    entry too: the database decides, and neither store's buffer changes."""
    other = second_look()
    assert other.arrived_entries() == set() and other.buffered_count() == 0  # (read, and kept, before the arrival)
    arrive(store, 3)
    assert other.has_arrived(3) and not other.has_arrived(4)  # (read now, not from what it keeps)
    for relay in (store, other):
        with pytest.raises(AlreadyArrived, match="entry 3 already has a result"):
            arrive(relay, 3, "p-b")
        assert 3 in relay.arrived_entries() and relay.arrived(3) and relay.arrived_count() == 1
    assert store.buffered_count() == 1 and [row[1] for row in other.buffered()] == [3]


def test_merges_the_checkpoint_lacks_go_back_to_the_buffer(store: Store) -> None:
    seqs = [arrive(store, entry) for entry in range(5)]
    store.mark_merged(seqs[0:2], 0)
    store.mark_merged(seqs[2:4], 1)
    assert store.unmerge_from(1) == 2
    assert [row[0] for row in store.buffered()] == seqs[2:]
    assert [row[4] for row in store.arrivals()] == [0, 0]
    assert store.unmerge_from(1) == 0


def test_pruning_empties_arrivals_merged_before_a_merge(store: Store) -> None:
    seqs = [arrive(store, entry) for entry in range(4)]
    store.mark_merged(seqs[0:2], 0)
    store.mark_merged(seqs[2:3], 1)
    assert store.prune_arrivals_before(1) == 2
    assert store.prune_arrivals_before(1) == 0
    assert [row[-1] for row in store.arrivals()] == [b"", b"", b"message 2"]
    # (not merged: untouched)
    assert store.buffered() == [(seqs[3], 3, 13, 0, 256, {"loss": 3}, b"update 3", b"message 3")]


def test_pruning_empties_the_async_copies_of_entries_merged_before_a_merge(store: Store) -> None:
    """An async copy (round -1, its entry as the slot) keeps its message while its entry waits (a dispute reads it),
    and loses it with its entry's arrival: before, nothing emptied them and the file grew by 585 KB a copy."""
    seqs = [arrive(store, entry) for entry in range(3)]
    for entry in range(3):
        store.add_copy(ASYNC_ROUND, entry, "p-copy", f"copy {entry}".encode(), "identical")
    store.mark_merged(seqs[0:1], 0)
    store.mark_merged(seqs[1:2], 1)
    assert store.prune_arrivals_before(1) == 2  # (entry 0's arrival and its copy)
    assert [store.copy_message(ASYNC_ROUND, entry, "p-copy") for entry in range(3)] == [b"", b"copy 1", b"copy 2"]
    assert store.prune_arrivals_before(1) == 0


def test_what_the_store_keeps_of_the_buffer_is_what_its_database_says(store: Store,
                                                                      second_look: Callable[[], Store]) -> None:
    """The entries, the waiting count and the oldest waiting are kept between reads (the stream asks on every
    request for work); each change leaves them as a fresh read of the database gives them, a refused arrival
    included."""
    peer_id, _ = store.add_peer()
    other, _ = store.add_peer()
    assert store.arrived_entries() == set() and store.buffered_count() == 0  # (read now, and kept)
    assert store.buffered_seqs(2) == []
    seqs = [arrive(store, entry, peer_id) for entry in (5, 1, 9)]
    with pytest.raises(Exception):  # noqa: B017 (each database raises its own integrity error)
        arrive(store, 5, peer_id)
    for change, waiting, entries in (
            (lambda: None, 3, {1, 5, 9}), (lambda: store.mark_merged(seqs[:2], 0), 1, {1, 5, 9}),
            (lambda: arrive(store, 3, other), 2, {1, 3, 5, 9}), (lambda: arrive(store, 4, other), 3, {1, 3, 4, 5, 9}),
            (lambda: store.unmerge_from(0), 5, {1, 3, 4, 5, 9}),
            (lambda: store.unmerged_arrival(1, take=True), 4, {3, 4, 5, 9}),
            (lambda: store.remove_arrivals_of(other), 2, {5, 9})):
        change()
        fresh = second_look()
        assert store.arrived_entries() == fresh.arrived_entries() == entries
        assert store.buffered_count() == fresh.buffered_count() == waiting
        assert [store.buffered_seqs(k) for k in (2, 2, 10)] == [fresh.buffered_seqs(k) for k in (2, 2, 10)]
    store.close()
    arrive(second_look(), 2, peer_id)  # (another process's arrival while this store was closed)
    store.open()
    assert store.arrived_entries() == {2, 5, 9} and store.buffered_count() == 3 and len(store.buffered_seqs(5)) == 3


def test_a_banned_peers_arrivals_not_merged_leave_the_buffer_with_its_leases(store: Store,
                                                                           second_look: Callable[[], Store]) -> None:
    """Its merged arrivals stay; the entries taken out have no result (they go out again), and what the store keeps
    of the buffer is what a fresh read gives."""
    liar, _ = store.add_peer()
    honest, _ = store.add_peer()
    seqs = [arrive(store, entry, peer) for entry, peer in ((0, liar), (1, honest), (2, liar), (3, liar))]
    store.mark_merged(seqs[:1], 0)
    for entry in (4, 5):
        assert store.grant(ASYNC_ROUND, entry, 10 + entry, liar if entry == 4 else honest, 60) is not None
    assert store.buffered_seqs(2) == seqs[1:3] and store.buffered_seqs(10) == seqs[1:]
    assert sorted(store.remove_arrivals_of(liar)) == [2, 3]
    assert store.remove_arrivals_of(liar) == []
    fresh = second_look()
    for relay in (store, fresh):
        assert relay.arrived_entries() == {0, 1} and not relay.arrived(2) and relay.buffered_count() == 1
        assert [row[0] for row in relay.buffered()] == [seqs[1]] and relay.buffered_seqs(5) == [seqs[1]]
        assert set(relay.leases(ASYNC_ROUND)) == {5}  # (the liar's lease on entry 4 went with it)
    assert [row[0] for row in store.arrivals()] == seqs[:1]
    arrive(store, 2, honest)  # (the entry arrives again, from another peer)
    assert store.arrived(2) and store.buffered_count() == 2


def test_an_arrival_read_or_taken_out_of_the_buffer_alone(store: Store, second_look: Callable[[], Store]) -> None:
    """Async copies that disagree take one arrival out of the buffer (``take``): its entry has no result then, the
    others stay; a merged arrival is neither read nor taken."""
    peer, other = store.add_peer()[0], store.add_peer()[0]
    seqs = [arrive(store, entry, who) for entry, who in ((0, peer), (1, peer), (2, other))]
    store.mark_merged(seqs[:1], 0)
    assert store.unmerged_arrival(1) == (peer, b"message 1") and store.unmerged_arrival(0) is None
    assert store.buffered_count() == 2  # (a read takes nothing)
    assert store.unmerged_arrival(1, take=True) == (peer, b"message 1")
    assert store.unmerged_arrival(1, take=True) is None and store.unmerged_arrival(0, take=True) is None
    for relay in (store, second_look()):
        assert relay.arrived_entries() == {0, 2} and not relay.arrived(1) and relay.buffered_count() == 1
        assert relay.buffered_seqs(5) == [seqs[2]]
    arrive(store, 1, other)  # (the entry arrives again)
    assert store.arrived(1) and store.buffered_count() == 2


def test_an_arrived_entry_may_have_a_second_copy_leased_beside_it(store: Store) -> None:
    store.add_arrival(entry=4, unit_index=9, peer_id="p-a", version=3, num_examples=1, metrics={}, message=b"m",
                      update=b"")
    assert store.grant(ASYNC_ROUND, 4, 9, "p-b", 10.0, version=3) is None  # (its unit's own lease: never again)
    copy = store.grant(ASYNC_ROUND, 4, 9, "p-b", 10.0, copy=1, version=3)
    assert copy is not None and store.lease(ASYNC_ROUND, 4, 1) == copy and store.lease(ASYNC_ROUND, 4) is None


def test_merged_arrivals_have_audit_rows_with_how_each_was_checked(store: Store,
                                                                   second_look: Callable[[], Store]) -> None:
    """Round -1's verification goes to the arrival of that entry and peer (outcomes joined, as a result's are); the
    audit lists merged arrivals after the rounds' results, their size kept when pruning empties the message."""
    peer, other = store.add_peer()[0], store.add_peer()[0]
    seqs = [arrive(store, entry, who, version=entry) for entry, who in ((3, peer), (1, other), (2, peer))]
    store.set_verification(ASYNC_ROUND, 3, peer, "replay passed (first, identical bits)")
    store.set_verification(ASYNC_ROUND, 3, peer, "copy identical (from p-x)")
    store.set_verification(ASYNC_ROUND, 1, peer, "not its peer's arrival")  # (entry 1 is other's)
    store.set_verification(0, 3, peer, "a round's result: not this arrival")
    assert store.audit() == []  # (nothing merged)
    store.mark_merged(seqs[:2], 0)
    store.mark_merged(seqs[2:], 1)
    store.prune_arrivals_before(1)
    rows = second_look().audit()
    assert [(row["round"], row["slot"], row["peer_id"], row["started_from"]) for row in rows] == [
        (0, 3, peer, 3), (0, 1, other, 1), (1, 2, peer, 2)]
    assert [row["verification"] for row in rows] == [
        "replay passed (first, identical bits); copy identical (from p-x)", "not checked", "not checked"]
    assert [row["size"] for row in rows] == [9, 9, 9] and [row["message_kept"] for row in rows] == [False, False, True]
    assert rows[0]["sha256"] == hashlib.sha256(b"message 3").hexdigest() and rows[0]["metrics"] == {"loss": 3}
    assert rows[0]["unit_index"] == 13 and rows[0]["num_examples"] == 256


def test_what_a_held_arrival_waits_for_outlives_the_store(store: Store, second_look: Callable[[], Store]) -> None:
    """Held arrivals not merged yet, with what each waits for, in arrival order; an arrival that waits for nothing
    more, a merged one and one taken out of the buffer are not; the audit row of a held one says "not checked"."""
    peer, other = store.add_peer()[0], store.add_peer()[0]
    seqs = [arrive(store, entry, who, version=7) for entry, who in ((5, peer), (2, other), (9, peer), (4, other))]
    store.hold_arrival(5, peer, {"replay", "copy"})
    store.hold_arrival(2, other, {"copy"})
    store.hold_arrival(9, peer, {"copy"})
    store.hold_arrival(4, other, {"replay"})
    store.hold_arrival(9, peer, ())  # (its copy agreed)
    store.hold_arrival(2, peer, {"copy"})  # (not entry 2's arrival: that is other's)
    store.mark_merged([seqs[3]], 0)
    assert store.unmerged_arrival(2, take=True) is not None
    store.set_verification(ASYNC_ROUND, 5, peer, "replay passed (first, identical bits)")
    for relay in (store, second_look()):
        assert relay.held_arrivals() == [(seqs[0], 5, peer, 7, frozenset({"copy", "replay"}))]
    store.mark_merged([seqs[0]], 1)
    assert store.held_arrivals() == []
    assert [row["verification"] for row in store.audit()] == ["not checked", "replay passed (first, identical bits)"]
