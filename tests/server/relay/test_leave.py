"""``POST /api/leave``: a peer that goes (its page closes, its volunteer gives a core fewer) frees its leases at once,
so its units go to the next peer that asks instead of waiting out the lease, and it stops counting as connected."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from relay_fixtures import (
    HttpPeer,
    build_small_package,
    make_relay,
    serving,
    session_status,
    wait_until,
    work_until_done,
)

LONG_LEASE = 3600.0  # a lease that cannot run out during the test: only leaving frees it


def test_a_peer_that_leaves_frees_its_unit_for_the_next_peer_at_once(tmp_path: Path) -> None:
    package = build_small_package(tmp_path / "package")
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, lease_seconds=LONG_LEASE, verify=False)
    with serving(relay) as client:
        going, staying = HttpPeer(client), HttpPeer(client)
        held = going.assignment()
        first = staying.assignment()
        assert first["slot"] != held["slot"]
        assert staying.train_and_upload(first).status_code == 200
        # Every other slot of the round is leased or done: the one held by the going peer is not handed out.
        assert "wait" in staying.work()
        assert session_status(client)["peers"]["connected"] == 2
        trained = going.train(held)  # (what it had in flight when it went)

        assert going.leave() == {"released": 1}

        assert session_status(client)["peers"]["connected"] == 1
        taken = staying.assignment()
        assert (taken["round"], taken["slot"], taken["unit_index"]) == (held["round"], held["slot"],
                                                                         held["unit_index"])
        assert staying.train_and_upload(taken).status_code == 200
        # The peer that left may still upload what it trained: its slot is now someone else's.
        late = going.upload(held["round"], held["slot"], trained)
        assert late.status_code in (403, 409), late.text
        work_until_done(client, [staying])
        assert session_status(client)["done"]
        counters = relay.store.counters()
        assert counters["peers_left"] == 1 and counters["leases_released_on_leave"] == 1


def test_leaving_needs_the_peers_credentials_and_changes_nothing_without_them(tmp_path: Path) -> None:
    package = build_small_package(tmp_path / "package")
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, lease_seconds=LONG_LEASE, verify=False)
    with serving(relay) as client:
        peer = HttpPeer(client)
        peer.assignment()
        forged = client.post("/api/leave", headers={"Authorization": f"Bearer {peer.peer_id}:not-the-token"})
        assert forged.status_code == 401 and forged.json()["error"] == "unauthorized"
        assert client.post("/api/leave").status_code == 401
        assert session_status(client)["peers"]["connected"] == 1
        assert relay.store.counters().get("peers_left", 0) == 0
        # An ask the peer sent before leaving that arrives after (a closing page's last request racing its keepalive
        # leave) is answered a wait: no lease, and the peer is not counted connected again.
        assert peer.leave() == {"released": 1}
        late = peer.work()
        assert "slot" not in late and "left the session" in late["reason"]
        status = session_status(client)
        assert status["peers"]["connected"] == 0 and status["round_progress"]["leased"] == 0
        assert client.post("/api/work?back=2", headers=peer.credentials.headers).json()["error"] == "bad_query"
        # A peer that left and asks again saying so is back: leaving is not a ban.
        assert "slot" in peer.work(back=True)
        assert session_status(client)["peers"]["connected"] == 1


def test_a_held_ask_of_a_peer_that_leaves_ends_without_a_lease_and_does_not_bring_it_back(tmp_path: Path) -> None:
    package = build_small_package(tmp_path / "package")
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, lease_seconds=LONG_LEASE, verify=False)
    with serving(relay) as client:
        going, staying = HttpPeer(client), HttpPeer(client)
        mine, theirs = going.assignment(), staying.assignment()
        assert going.train_and_upload(mine).status_code == 200
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(going.work, 15)  # the page's worker waits for the round (a held ask)...
            for _ in range(2000):  # (bounded: 20 s)
                if relay.notices.holding or held.done():
                    break
                time.sleep(0.01)
            assert relay.notices.holding == 1, "the ask was not held"
            assert going.leave() == {"released": 0}  # ...when its page closes
            answer = held.result(timeout=20)
        assert "slot" not in answer and answer["reason"] == "this peer left the session"
        assert session_status(client)["peers"]["connected"] == 1  # its own ask, still held, did not bring it back
        assert staying.train_and_upload(theirs).status_code == 200
        wait_until(client, lambda status: status["round"] == 1 and not status["merging"])  # (merged in the background)
