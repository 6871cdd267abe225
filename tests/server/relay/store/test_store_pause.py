"""A store's host's pause: none until set, the last one set, kept across a close and for another relay on the same
database (a shared store reads it again once what it keeps is ``SHARED_VIEW_SECONDS`` old)."""

from __future__ import annotations

from collections.abc import Callable

from virtual_clock import Clock

from server.relay.store import Store
from server.relay.store.sql.views import SHARED_VIEW_SECONDS


def test_the_pause_set_last_is_read_back_and_outlives_a_close(store: Store) -> None:
    assert store.pause() == (False, None)
    store.set_pause(True, None)
    assert store.pause() == (True, None)
    store.set_pause(False, 4)  # (pause-after-round: round 4 and later wait)
    assert store.pause() == (False, 4)
    store.close()
    store.open()
    assert store.pause() == (False, 4)
    store.set_pause(True, 4)  # (paused again, the round kept)
    store.set_pause(False, None)
    assert store.pause() == (False, None)


def test_another_relay_reads_the_pause_a_moment_later(store: Store, second_look: Callable[[], Store],
                                                      clock: Clock) -> None:
    other = second_look()
    other.shared = True  # type: ignore[misc]  # (a SQLite store is shared by no one unless told)
    assert other.pause() == (False, None)  # (read, and kept)
    generation = other.generation()
    store.set_pause(True, None)
    assert other.pause() == (False, None)  # (kept: not read again yet)
    clock.advance(SHARED_VIEW_SECONDS)
    assert other.pause() == (True, None) and other.generation() > generation
    assert second_look().pause() == (True, None)  # (a relay started now: a restart stays paused)
