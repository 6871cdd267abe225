"""A store's results handed over by a replica of a synchronous session (``ForwardStore``): waiting in the order they
came until judged, the verdicts of many read at once and each once (its row goes with it), a withdrawal only of what
is not judged, and the rows of past rounds pruned; another relay on the same database sees the same rows."""

from __future__ import annotations

from collections.abc import Callable

from server.relay.store import Store, StoredResult


def test_results_handed_over_wait_in_order_until_judged_and_the_verdict_is_read_once(
        store: Store, second_look: Callable[[], Store]) -> None:
    holder = second_look()  # (the relay holding the session: the same database)
    first = store.forward_result(0, 1, "p1", b"one")
    second = store.forward_result(0, 0, "p2", b"two")
    assert second > first
    waiting = holder.forwarded(10)
    assert [(r.id, r.round, r.slot, r.peer_id, r.message) for r in waiting] == \
        [(first, 0, 1, "p1", b"one"), (second, 0, 0, "p2", b"two")]
    assert [r.id for r in holder.forwarded(1)] == [first]
    assert store.take_verdicts([first, second]) == {}  # (not judged yet: nothing to read, the rows stay)
    holder.settle_forwarded(first, {"accepted": True, "num_examples": 64})
    assert [r.id for r in holder.forwarded(10)] == [second]  # (judged: no longer waiting)
    assert store.take_verdicts([first, second]) == {first: {"accepted": True, "num_examples": 64}}
    assert store.take_verdicts([first]) == {}  # (read once)
    assert not store.withdraw_forwarded(first)


def test_a_withdrawal_takes_back_only_a_result_not_judged_yet(store: Store) -> None:
    waiting = store.forward_result(2, 0, "p1", b"x")
    judged = store.forward_result(2, 1, "p2", b"y")
    store.settle_forwarded(judged, {"status": 409, "error": "duplicate", "message": "m"})
    assert store.withdraw_forwarded(waiting) and store.forwarded(10) == []
    assert store.take_verdicts([waiting]) == {}
    assert not store.withdraw_forwarded(judged)  # (judged meanwhile: its verdict is there to read)
    assert store.take_verdicts([judged, waiting]) == {judged: {"status": 409, "error": "duplicate", "message": "m"}}


def test_pruning_a_round_drops_what_a_stopped_replica_never_read(store: Store) -> None:
    old = store.forward_result(0, 0, "p1", b"x")
    store.settle_forwarded(old, {"accepted": True})
    new = store.forward_result(1, 0, "p1", b"y")
    store.prune_before(1)
    assert store.take_verdicts([old]) == {}
    assert [r.id for r in store.forwarded(10)] == [new]


def test_a_slot_with_its_result_is_not_leased_again_but_its_copy_is(store: Store) -> None:
    """(A replica whose view of the results is a moment old asks for a slot another relay's result filled.)"""
    assert store.grant(0, 0, 5, "p1", 10.0) is not None
    store.add_result(StoredResult(0, 0, 5, "p1", 64, {}, b"m"))
    store.release(0, 0)
    assert store.grant(0, 0, 5, "p2", 10.0) is None
    assert store.grant(0, 0, 5, "p2", 10.0, copy=1) is not None
    assert store.grant(0, 1, 6, "p2", 10.0) is not None


def test_whether_a_slot_has_its_result_is_read_from_the_database(store: Store,
                                                                  second_look: Callable[[], Store]) -> None:
    other = second_look()
    assert other.result_slots(0) == set() and not other.has_result(0, 0)
    store.add_result(StoredResult(0, 0, 5, "p1", 64, {}, b"m"))
    assert other.has_result(0, 0) and not other.has_result(0, 1) and not other.has_result(1, 0)
