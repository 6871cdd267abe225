"""A store's peers: tokens, the last-seen clock that decides who counts as connected, addresses, the listing."""

from __future__ import annotations

import pytest
from virtual_clock import Clock

from server.relay.store import LAST_SEEN_RESOLUTION, Store
from server.relay.store.sql import peers


def last_seen(store: Store, peer_id: str) -> float:
    return float(next(row["last_seen"] for row in store.peers_listing() if row["peer_id"] == peer_id))


def test_tokens_are_checked_and_last_seen_is_written_at_most_once_per_resolution(store: Store, clock: Clock) -> None:
    peer_id, token = store.add_peer("test")
    assert store.authenticate(peer_id, token)
    assert not store.authenticate(peer_id, token + "x")
    assert not store.authenticate("p-nobody", token)
    clock.advance(LAST_SEEN_RESOLUTION / 2)
    assert store.authenticate(peer_id, token)
    assert last_seen(store, peer_id) == 1000.0  # a synced write per request would be wasted here
    clock.advance(LAST_SEEN_RESOLUTION)
    assert store.authenticate(peer_id, token)
    assert last_seen(store, peer_id) == clock()
    clock.advance(29.0)
    assert store.active_peers(30.0) == [peer_id]
    clock.advance(2.0)
    assert store.active_peers(30.0) == []
    assert not store.authenticate(peer_id, "wrong")
    assert store.active_peers(30.0) == []  # a wrong token does not count as being seen


def test_an_untouching_authentication_and_a_departure_leave_a_peer_unseen(store: Store, clock: Clock) -> None:
    peer_id, token = store.add_peer("test", "10.0.0.1")
    clock.advance(60.0)
    assert store.authenticate(peer_id, token, touch=False)  # (a request of a peer that left, still in flight)
    assert store.active_peers(30.0) == [] and last_seen(store, peer_id) == 1000.0
    assert store.authenticate(peer_id, token)
    assert store.active_peers(30.0) == [peer_id] and store.live_peers_at("10.0.0.1", 30.0) == 1
    store.depart(peer_id)
    assert store.active_peers(30.0) == [] and store.live_peers_at("10.0.0.1", 30.0) == 0
    assert store.authenticate(peer_id, token)  # the token stays valid: asking again brings it back
    assert store.active_peers(30.0) == [peer_id]


def test_ids_tokens_and_addresses(store: Store, clock: Clock) -> None:
    assert store.peer_count() == 0 and store.addresses(30.0) == 0 and store.peers_listing() == []
    first, first_token = store.add_peer("agent-a", "10.0.0.1")
    clock.advance(1.0)
    second, second_token = store.add_peer("agent-b", "10.0.0.1")
    clock.advance(1.0)
    third, _ = store.add_peer("x" * 300, "10.0.0.2")
    assert len({first, second, third}) == 3 and first_token != second_token
    assert store.peer_count() == 3
    assert store.peer_address(first) == "10.0.0.1" and store.peer_address("p-nobody") == ""
    assert store.live_peers_at("10.0.0.1", 30.0) == 2 and store.live_peers_at("10.0.0.9", 30.0) == 0
    assert store.addresses(30.0) == 2
    clock.advance(1.5)
    assert store.live_peers_at("10.0.0.1", 2.5) == 1 and store.addresses(2.5) == 2  # (the first is 3.5 s old)
    assert not store.authenticate(first, second_token)


def test_the_listing_is_in_joining_order_with_bans(store: Store, clock: Clock) -> None:
    honest, _ = store.add_peer("chromium", "10.0.0.1")
    clock.advance(1.0)
    liar, _ = store.add_peer("x" * 300, "10.0.0.2")
    clock.advance(1.0)
    store.ban(liar, "replay failed")
    listing = store.peers_listing()
    assert [row["peer_id"] for row in listing] == [honest, liar]
    assert listing[0] == {"peer_id": honest, "address": "10.0.0.1", "agent": "chromium", "joined": 1000.0,
                          "last_seen": 1000.0, "units_done": 0, "banned": False, "ban_reason": None,
                          "banned_at": None}
    assert listing[1]["agent"] == "x" * 200  # (kept to 200 characters)
    assert (listing[1]["banned"], listing[1]["ban_reason"], listing[1]["banned_at"]) == (True, "replay failed",
                                                                                         1002.0)


def test_the_recent_peers_are_the_listings_most_recently_seen_in_order(store: Store, clock: Clock) -> None:
    """What the status shows of a crowd: the listing sorted by last seen, latest first (ties in joining order),
    cut to the limit, read without the whole listing."""
    peers = []
    for index in range(6):
        peers.append(store.add_peer("agent", f"10.0.0.{index}"))
        clock.advance(1.0)
    store.ban(peers[2][0], "replay failed")
    for peer_id, token in (peers[1], peers[4]):
        clock.advance(LAST_SEEN_RESOLUTION + 1)
        assert store.authenticate(peer_id, token)
    expected = sorted(store.peers_listing(), key=lambda row: row["last_seen"], reverse=True)  # (stable: ties join)
    assert [row["peer_id"] for row in expected[:2]] == [peers[4][0], peers[1][0]]
    for limit in (0, 1, 3, 6, 10):
        assert store.recent_peers(limit) == expected[:limit]


def test_a_banned_peer_is_never_active(store: Store, clock: Clock) -> None:
    peer_id, _ = store.add_peer()
    store.grant(0, 0, 3, peer_id, 60.0)
    assert store.active_peers(30.0) == [peer_id]
    store.ban(peer_id, "test")
    assert store.active_peers(30.0) == []
    assert store.unban(peer_id)
    assert store.active_peers(30.0) == [peer_id]


def test_the_active_peers_are_kept_for_a_moment_and_forgotten_on_every_change(store: Store, clock: Clock) -> None:
    """Asked on every request for work, the answer is kept for a tenth of the window (at most LAST_SEEN_RESOLUTION,
    last_seen's own precision): a peer that went quiet past the window meanwhile still counts that long. A join, a
    return, a ban, an unban, a departure or a release is seen at once."""
    first, first_token = store.add_peer("a")
    clock.advance(29.9)
    assert store.active_peers(30.0) == [first]
    clock.advance(0.2)  # (first now unseen for 30.1 s, read 0.2 s ago)
    assert store.active_peers(30.0) == [first]
    assert store.active_peers(3.0) == []  # (another window: read again)
    clock.advance(LAST_SEEN_RESOLUTION)
    assert store.active_peers(30.0) == []
    second, _ = store.add_peer("b")
    assert store.active_peers(30.0) == [second]
    assert store.authenticate(first, first_token)
    assert store.active_peers(30.0) == sorted([first, second])
    store.ban(second, "test")
    assert store.active_peers(30.0) == [first]
    store.unban(second)
    assert store.active_peers(30.0) == sorted([first, second])
    store.depart(first)
    assert store.active_peers(30.0) == [second]
    clock.advance(40.0)
    store.grant(0, 0, 0, second, 60.0)  # (a lease keeps its peer active, though unseen)
    assert store.active_peers(30.0) == [second]
    store.release(0, 0)
    assert store.active_peers(30.0) == []


def test_what_is_kept_of_the_peers_stays_bounded(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token's hash and an address are kept once read, for at most ``KNOWN_PEERS`` peers (a session open for months
    meets millions): past it what is kept is forgotten, and a peer forgotten is read again."""
    monkeypatch.setattr(peers, "KNOWN_PEERS", 3)
    joined = [store.add_peer("agent", f"10.0.0.{i}") for i in range(7)]
    for _ in range(2):
        for i, (peer_id, token) in enumerate(joined):
            assert store.authenticate(peer_id, token) and not store.authenticate(peer_id, "wrong")
            assert store.peer_address(peer_id) == f"10.0.0.{i}"
    kept = store._peers  # type: ignore[attr-defined]
    assert len(kept.known) <= 3 and len(kept.address_of) <= 3
