"""A store's results and second copies: kept with their messages, listed, replaced, removed, verified, audited and
pruned to their audit rows (bounded disk)."""

from __future__ import annotations

import hashlib

import pytest
from virtual_clock import Clock

from server.relay.store import Store, StoredResult


def result(round_index: int, slot: int, peer_id: str, message: bytes = b"update") -> StoredResult:
    return StoredResult(round_index, slot, 10 + slot, peer_id, 256, {"loss": 0.5}, message)


def units_done(store: Store, peer_id: str) -> int:
    return int(next(row["units_done"] for row in store.peers_listing() if row["peer_id"] == peer_id))


def test_a_result_is_kept_with_its_message_and_counted_for_its_peer(store: Store) -> None:
    peer_id, _ = store.add_peer()
    assert store.results(0) == {} and store.all_results() == [] and store.result_slots(0) == set()
    assert store.result_peer(0, 1) is None
    store.add_result(result(0, 1, peer_id, b"one"))
    store.add_result(result(0, 0, peer_id, b"zero"), count_unit=False)  # (a promoted copy: counted already)
    store.add_result(result(1, 0, "p-other", b"next"))
    assert units_done(store, peer_id) == 1
    assert store.results(0) == {0: result(0, 0, peer_id, b"zero"), 1: result(0, 1, peer_id, b"one")}
    assert list(store.results(0)) == [0, 1]
    assert store.all_results() == [result(0, 0, peer_id, b"zero"), result(0, 1, peer_id, b"one"),
                                   result(1, 0, "p-other", b"next")]
    assert store.result_slots(0) == {0, 1} and store.result_peer(0, 1) == peer_id
    assert store.results(0)[0].engine == ""  # (not stored apart from the message)


def test_a_second_result_on_a_slot_is_refused(store: Store) -> None:
    store.add_result(result(0, 0, "p-a"))
    with pytest.raises(Exception):  # noqa: B017 (each database raises its own integrity error)
        store.add_result(result(0, 0, "p-b"))
    assert store.result_peer(0, 0) == "p-a"


def test_a_replaced_message_keeps_the_uploads_audit(store: Store) -> None:
    store.add_result(result(0, 0, "p-a", b"upload"))
    store.replace_message(0, 0, b"rebased")
    assert store.results(0)[0].message == b"rebased"
    (row,) = store.audit()
    assert row["sha256"] == hashlib.sha256(b"upload").hexdigest() and row["size"] == len(b"upload")


def test_removing_results(store: Store) -> None:
    for slot, peer_id in enumerate(["p-a", "p-b", "p-a", "p-c"]):
        store.grant(0, slot, 10 + slot, peer_id, 60.0)
        store.add_result(result(0, slot, peer_id))
    store.add_result(result(1, 0, "p-a"))
    store.remove_result(0, 3)
    store.remove_result(0, 9)  # (none: no error)
    assert store.result_slots(0) == {0, 1, 2}
    assert sorted(store.remove_results_of("p-a", 0)) == [0, 2]
    assert store.result_slots(0) == {1} and set(store.leases(0)) == {1, 3} and store.result_slots(1) == {0}
    assert store.remove_results_of("p-nobody", 0) == []


def test_resetting_a_round_forgets_its_results_copies_and_leases(store: Store) -> None:
    store.add_result(result(0, 0, "p-a"))
    store.add_result(result(0, 1, "p-b"))
    store.add_copy(0, 0, "p-c", b"copy", "identical")
    store.grant(0, 2, 12, "p-d", 60.0)
    store.add_result(result(1, 0, "p-a"))
    store.add_copy(1, 0, "p-c", b"copy", "identical")
    assert store.reset_round(0) == 2
    assert store.results(0) == {} and store.copies(0) == {} and store.leases(0) == {}
    assert set(store.results(1)) == {0} and store.copies(1) == {(0, "p-c"): "identical"}
    assert store.reset_round(0) == 0


def test_the_audit_lists_every_result_without_its_message(store: Store, clock: Clock) -> None:
    assert store.audit() == []
    store.add_result(result(0, 1, "p-a", b"first"))
    clock.advance(2.0)
    store.add_result(result(0, 0, "p-b", b"second"))
    store.set_verification(0, 1, "p-a", "replay passed")
    store.set_verification(0, 1, "p-a", "copy identical")
    store.set_verification(0, 0, "p-a", "replay passed")  # (not p-a's result: nothing recorded)
    assert store.audit() == [
        {"round": 0, "slot": 0, "unit_index": 10, "peer_id": "p-b", "num_examples": 256, "metrics": {"loss": 0.5},
         "sha256": hashlib.sha256(b"second").hexdigest(), "size": 6, "verification": "not checked",
         "message_kept": True, "received": 1002.0},
        {"round": 0, "slot": 1, "unit_index": 11, "peer_id": "p-a", "num_examples": 256, "metrics": {"loss": 0.5},
         "sha256": hashlib.sha256(b"first").hexdigest(), "size": 5, "verification": "replay passed; copy identical",
         "message_kept": True, "received": 1000.0}]
    store.set_verification(0, 0, "p-b", "x" * 300)
    store.set_verification(0, 0, "p-b", "y" * 300)
    assert len(store.audit()[0]["verification"]) == 500


def test_pruning_empties_older_rounds_messages_and_keeps_their_audit(store: Store) -> None:
    for round_index in range(3):
        store.add_result(result(round_index, 0, "p-a", b"message %d" % round_index))
        store.add_copy(round_index, 0, "p-b", b"copy %d" % round_index, "identical")
    store.add_copy(-1, 7, "p-c", b"async copy", "unresolved")  # (async mode's copies wait for their quorum)
    audit = store.audit()
    assert store.pruned_rounds(0, 3) == set()
    assert store.prune_before(2) == 4  # two results, two copies
    assert store.prune_before(2) == 0  # (emptied already)
    assert store.copy_message(-1, 7, "p-c") == b"async copy"
    assert [r.message for r in store.all_results()] == [b"", b"", b"message 2"]
    assert [store.copy_message(r, 0, "p-b") for r in range(3)] == [b"", b"", b"copy 2"]
    assert [row["message_kept"] for row in store.audit()] == [False, False, True]
    assert [{**row, "message_kept": True} for row in store.audit()] == audit
    assert store.pruned_rounds(0, 3) == {0, 1} and store.pruned_rounds(1, 3) == {1}


def test_second_copies_are_kept_apart_and_compared(store: Store) -> None:
    peer_id, _ = store.add_peer()
    assert store.copies(0) == {} and store.copy_message(0, 0, peer_id) is None
    store.add_copy(0, 0, peer_id, b"copy", "pending")
    store.add_copy(0, 1, "p-other", b"other", "pending")
    store.add_copy(1, 0, peer_id, b"later", "pending")
    assert units_done(store, peer_id) == 2
    store.set_copy_outcome(0, 0, peer_id, "identical")
    store.set_copy_outcome(0, 0, "p-nobody", "disputed")  # (no such copy: nothing)
    assert store.copies(0) == {(0, peer_id): "identical", (1, "p-other"): "pending"}
    assert store.copy_message(0, 0, peer_id) == b"copy" and store.copy_message(0, 2, peer_id) is None
    store.add_copy(0, 0, peer_id, b"again", "disputed")  # (replaces the peer's earlier copy)
    assert store.copies(0)[(0, peer_id)] == "disputed" and store.copy_message(0, 0, peer_id) == b"again"
    assert store.results(0) == {}  # (never merged)


def test_the_peers_a_comparison_confirmed_are_read_back(store: Store, clock: Clock) -> None:
    """A copy that matched (both its peer and the merged result's), copies a quorum or a replay upheld and the
    result they agreed with, a copy that took a banned peer's place; not a disputed, lied, unresolved or unchecked
    copy, nor a result nothing confirmed."""
    assert store.confirmed_peers() == set()
    store.add_result(result(0, 0, "p-merged"))
    store.add_copy(0, 0, "p-copy", b"copy", "identical")
    store.add_result(result(0, 1, "p-third"))
    store.add_copy(0, 1, "p-upheld", b"a", "upheld")
    store.add_copy(0, 1, "p-liar", b"b", "lied")
    store.add_result(result(0, 2, "p-alone"))
    store.add_copy(0, 2, "p-disputed", b"c", "disputed")
    store.add_copy(0, 2, "p-unresolved", b"d", "unresolved")
    store.add_copy(1, 0, "p-replaced", b"e", "replaced")
    store.add_copy(1, 1, "p-other-class", b"f", "not_comparable")
    assert store.confirmed_peers() == {"p-merged", "p-copy", "p-third", "p-upheld", "p-replaced"}
    for entry, peer in ((4, "p-async"), (5, "p-async-alone")):  # (async mode: copies of round -1 beside arrivals)
        store.add_arrival(entry=entry, unit_index=entry, peer_id=peer, version=0, num_examples=1, metrics={},
                          message=b"m", update=b"")
    store.add_copy(-1, 4, "p-async-copy", b"g", "identical")
    store.add_copy(-1, 5, "p-async-liar", b"h", "disputed")
    assert store.confirmed_peers() == {"p-merged", "p-copy", "p-third", "p-upheld", "p-replaced", "p-async",
                                       "p-async-copy"}
    # an entry whose copy agreed, its first result dropped by a ban before it merged, arrives again from another
    # peer: the copy did not check that one
    assert store.remove_arrivals_of("p-async") == [4]
    clock.advance(1.0)
    store.add_arrival(entry=4, unit_index=4, peer_id="p-again", version=1, num_examples=1, metrics={}, message=b"m",
                      update=b"")
    assert "p-again" not in store.confirmed_peers() and "p-async-copy" in store.confirmed_peers()
