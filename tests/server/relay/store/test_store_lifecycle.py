"""A store's life: opened where it lives, closed and opened again with its data, counting from many threads, and
its bytes on disk."""

from __future__ import annotations

import threading

import pytest
from virtual_clock import Clock

from server.relay.store import Store, StoredResult


def test_data_outlives_a_close(store: Store, clock: Clock) -> None:
    peer_id, token = store.add_peer("agent", "10.0.0.1")
    store.add_result(StoredResult(0, 0, 3, peer_id, 256, {"loss": 1.0}, b"message"))
    store.count("results_accepted")
    assert not store.closed and store.clock is clock
    store.close()
    assert store.closed
    store.close()  # (again: nothing)
    with pytest.raises(Exception):  # noqa: B017 (each database raises its own error)
        store.counters()
    store.open()
    store.open()  # (again: nothing)
    assert not store.closed
    assert store.authenticate(peer_id, token) and store.result_slots(0) == {0}
    assert store.counters() == {"results_accepted": 1}


def test_counters_add_up_from_many_threads(store: Store) -> None:
    assert store.counters() == {}

    def count() -> None:
        for _ in range(50):
            store.count("b")
            store.count("a", 2)

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert store.counters() == {"a": 400, "b": 200} and list(store.counters()) == ["a", "b"]


def test_disk_bytes_count_what_is_written(store: Store) -> None:
    before = store.disk_bytes()
    store.add_result(StoredResult(0, 0, 3, "p-a", 256, {}, bytes(1 << 16)))
    assert store.disk_bytes() >= before
    assert store.path is None or store.path.is_file()  # (None: a server keeps it)


def test_the_generation_moves_on_every_change_a_relay_derives_from_but_not_on_a_touch(store: Store,
                                                                                      clock: Clock) -> None:
    """A relay keeps what it derives from the leases, results and copies (every poll of a thousand peers asks) for
    as long as the generation stands: any change to them moves it, a peer's touch (every request) does not."""
    peer_id, token = store.add_peer("agent", "10.0.0.1")
    store.active_peers(60.0)
    seen = [store.generation()]

    def moved() -> bool:
        seen.append(store.generation())
        return seen[-1] != seen[-2]

    assert store.authenticate(peer_id, token) and not moved(), "a touch of an active peer moved it"
    store.grant(0, 0, 3, peer_id, 30.0)
    assert moved()
    store.add_result(StoredResult(0, 0, 3, peer_id, 256, {}, b"message"))
    assert moved() and store.result_slots(0) == {0} and store.result_peer(0, 0) == peer_id
    store.add_copy(0, 0, "other", b"copy", "identical")
    assert moved()
    store.set_copy_outcome(0, 0, "other", "disputed")
    assert moved()
    store.release(0, 0)
    assert moved()
    store.remove_result(0, 0)
    assert moved() and store.result_slots(0) == set() and store.result_peer(0, 0) is None
    store.ban(peer_id, "test")
    assert moved()
    store.add_peer("agent", "10.0.0.2")
    assert moved()
    clock.advance(1.0)
    store.counters()
    if store.shared:  # (other relays may have changed anything meanwhile: what it keeps is read again)
        assert moved(), "a shared store kept what it read past SHARED_VIEW_SECONDS"
    else:
        assert not moved(), "reading moved it"
