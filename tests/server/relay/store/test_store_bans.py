"""A store's bans (a peer, and through it its address) and the undos they ask for."""

from __future__ import annotations

from collections.abc import Callable

from virtual_clock import Clock

from server.relay.store import Store, StoredResult
from server.relay.store.sql.views import SHARED_VIEW_SECONDS


def result(round_index: int, slot: int, peer_id: str) -> StoredResult:
    return StoredResult(round_index, slot, slot, peer_id, 256, {}, b"update")


def test_a_ban_names_the_peer_and_its_address(store: Store, clock: Clock) -> None:
    peer_id, _ = store.add_peer("agent", "10.0.0.1")
    assert store.ban_reason(peer_id) is None and not store.address_banned("10.0.0.1")
    assert store.ban(peer_id, "r" * 600) == "10.0.0.1"
    assert store.ban_reason(peer_id) == "r" * 500
    assert store.address_banned("10.0.0.1") and not store.address_banned("10.0.0.2") and not store.address_banned("")
    clock.advance(5.0)
    store.ban(peer_id, "again")
    assert store.ban_reason(peer_id) == "again" and store.peers_listing()[0]["banned_at"] == 1005.0
    assert store.unban(peer_id) and not store.unban(peer_id)
    assert store.ban_reason(peer_id) is None and not store.address_banned("10.0.0.1")
    assert store.ban("p-nobody", "unknown") == "" and store.ban_reason("p-nobody") == "unknown"


def test_an_undo_is_asked_once_until_done(store: Store, clock: Clock) -> None:
    assert store.undos() == []
    store.request_undo("p-b")
    clock.advance(1.0)
    store.request_undo("p-a")
    assert store.undos() == [("p-b", "pending", {}), ("p-a", "pending", {})]  # oldest first
    store.set_undo("p-b", "running", {"first": 3})
    store.request_undo("p-b")  # (running: stays as it is)
    assert store.undos()[0] == ("p-b", "running", {"first": 3})
    store.set_undo("p-b", "done", {"first": 3})
    assert store.undos() == [("p-a", "pending", {})]
    clock.advance(1.0)
    store.request_undo("p-b")  # an unban and a second ban: asked again, now the newest
    assert store.undos() == [("p-a", "pending", {}), ("p-b", "pending", {})]


def test_unverified_rounds_start_at_the_last_passed_replay(store: Store) -> None:
    assert store.unverified_rounds("p-a") == (None, [])
    for round_index in range(6):
        store.add_result(result(round_index, 0, "p-a"))
    store.add_result(result(2, 1, "p-b"))
    assert store.unverified_rounds("p-a") == (None, [0, 1, 2, 3, 4, 5])
    store.set_verification(2, 0, "p-a", "replay passed (bit for bit)")
    store.set_verification(4, 0, "p-a", "copy identical")
    assert store.unverified_rounds("p-a") == (2, [3, 4, 5])
    assert store.mark_undone("p-a", 3, 5) == 2
    assert store.unverified_rounds("p-a") == (2, [5])
    assert store.undone_slots(3) == {0} and store.undone_slots(2) == set() and store.undone_slots(5) == set()
    audit = {(row["round"], row["slot"]): row["verification"] for row in store.audit()}
    assert audit[(3, 0)] == "undone (peer banned)" and audit[(4, 0)] == "undone (peer banned); copy identical"
    assert audit[(2, 0)] == "replay passed (bit for bit)" and audit[(2, 1)] == "not checked"
    assert store.mark_undone("p-a", 0, 6) == 3  # rounds 0, 1, 5: a passed replay and an undone result stay as they are
    assert store.unverified_rounds("p-b") == (None, [2])


def test_another_relay_sees_a_ban_and_an_undo_a_moment_later_and_a_peer_that_joined_there(
        store: Store, second_look: Callable[[], Store], clock: Clock) -> None:
    """Bans and undos are kept as read (each copy's hand-out asks once per candidate, each result whether an undo
    waits): this store's own changes are seen at once, another relay's once what a shared store keeps is
    ``SHARED_VIEW_SECONDS`` old; a peer that joined at another relay authenticates here, its address read."""
    other = second_look()
    other.shared = True  # type: ignore[misc]  # (a SQLite store is shared by no one unless told)
    peer_id, token = store.add_peer("agent", "10.0.0.1")
    assert other.ban_reason(peer_id) is None  # (read, and kept)
    store.ban(peer_id, "lied")
    assert store.ban_reason(peer_id) == "lied" and other.ban_reason(peer_id) is None
    clock.advance(SHARED_VIEW_SECONDS)
    assert other.ban_reason(peer_id) == "lied"
    other.unban(peer_id)
    assert other.ban_reason(peer_id) is None
    joined, its_token = other.add_peer("agent", "10.0.0.2")
    assert store.authenticate(joined, its_token) and not store.authenticate(joined, token)
    assert other.authenticate(peer_id, token) and not other.authenticate(peer_id, its_token)
    assert store.peer_address(joined) == "10.0.0.2" and other.peer_address(peer_id) == "10.0.0.1"
    assert other.undos() == []  # (read, and kept)
    store.request_undo(peer_id)
    assert store.undos() == [(peer_id, "pending", {})] and other.undos() == []
    clock.advance(SHARED_VIEW_SECONDS)
    assert other.undos() == [(peer_id, "pending", {})]
