"""A store's refusals per slot (``RefusalStore``): kept per round, each peer once, forgotten before a round (after a
merge: the async stream's, under round -1, too) or from a round on (an undo), and seen by another relay on the same
database once what it keeps is ``SHARED_VIEW_SECONDS`` old."""

from __future__ import annotations

from collections.abc import Callable

from virtual_clock import Clock

from server.relay.store import Store
from server.relay.store.records import ASYNC_ROUND
from server.relay.store.sql.views import SHARED_VIEW_SECONDS


def test_refusals_are_kept_per_round_and_slot_and_forgotten_before_or_from_a_round(store: Store) -> None:
    assert store.slot_refusals(0) == {}
    store.refuse_slot(0, 1, ["p1"])
    store.refuse_slot(0, 1, ["p1", "p2"])  # (p1 again: once)
    store.refuse_slot(0, 3, ["p3"])
    store.refuse_slot(1, 0, ["p1"])
    store.refuse_slot(ASYNC_ROUND, 7, ["p4"])
    assert store.slot_refusals(0) == {1: frozenset({"p1", "p2"}), 3: frozenset({"p3"})}
    assert store.slot_refusals(ASYNC_ROUND) == {7: frozenset({"p4"})}
    store.forget_refusals(since=1)  # (an undo starts round 1 again; the async stream's stay)
    assert store.slot_refusals(1) == {} and store.slot_refusals(ASYNC_ROUND) == {7: frozenset({"p4"})}
    store.forget_refusals(before=1)  # (round 1 opens after a merge: round 0's and the stream's go)
    assert store.slot_refusals(0) == {} and store.slot_refusals(ASYNC_ROUND) == {}


def test_another_relay_sees_a_refusal_a_moment_later(store: Store, second_look: Callable[[], Store],
                                                     clock: Clock) -> None:
    other = second_look()
    other.shared = True  # type: ignore[misc]  # (a SQLite store is shared by no one unless told)
    assert other.slot_refusals(2) == {}  # (read, and kept)
    store.refuse_slot(2, 0, ["p1"])
    assert other.slot_refusals(2) == {}
    clock.advance(SHARED_VIEW_SECONDS)
    assert other.slot_refusals(2) == {0: frozenset({"p1"})}


def test_the_slots_that_want_a_copy_are_the_last_said_and_another_relay_sees_them_at_once(
        store: Store, second_look: Callable[[], Store]) -> None:
    other = second_look()
    other.shared = True  # type: ignore[misc]
    assert store.wanted_copies(0) == frozenset() and other.wanted_copies(0) == frozenset()
    store.want_copies(0, [3, 1])
    assert store.wanted_copies(0) == {1, 3}
    store.want_copies(0, [1])  # (slot 3's copy came)
    assert store.wanted_copies(0) == {1} and other.wanted_copies(0) == {1}  # (read afresh: not kept)
    store.want_copies(1, [0])  # (a new round: the last round's are forgotten)
    assert store.wanted_copies(0) == frozenset() and store.wanted_copies(1) == {0}
