"""Two relays serving one synchronous session together over one PostgreSQL store and one session folder
(``server.relay.sharing``): a replica hands out the round's units and hands the results it takes to the holder, which
judges each as if it had come there (its refusals reach the replica's peer with their codes) and merges; the replica
follows the holder's checkpoints, hands out no second copy, and takes the session over when the holder stops. The
weights are the recorded results' replay, bit for bit. A slot refused to a peer at one relay is not handed to it by
the other while another peer may take it (the refusals live in the store)."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import HttpPeer, ask_and_send, make_relay, recorded_results, replay, serving, session_status
from relay_process import wait_for

from server.relay import sharing
from server.relay.openapi import wire_refusals
from server.relay.state import MAX_HOLD_SECONDS, Relay
from server.relay.store import open_store
from server.session.package import Package
from server.session.session import Session

TURNS = 60  # a bound on the peers' turns (the session needs 6 rounds of two results)
WAIT_SECONDS = 30.0  # the bound on each wait for what a relay does in the background


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """6 chunks of 256 rows (the ``package`` fixture of conftest.py builds it once for this module)."""
    return {"examples": 1536, "chunks": 6}


def replica_of(relay: Relay, url: str) -> Relay:
    """A second relay over the same store and session folder, as ``serve`` starts one while another holds it."""
    assert relay.session.directory is not None
    session = Session.restore(relay.session.directory, relay.package, read_only=True)
    return Relay(session=session, package=relay.package, store=open_store(url), options=relay.options, replica=True)


def turn(peers: list[HttpPeer], ask: Any, send: Any) -> None:
    """Each peer asks ``ask`` for work and sends its result to ``send``."""
    for peer in peers:
        ask_and_send(peer, ask, send)


def caught_up(holder: Relay, replica: Relay) -> None:
    """Wait until the holder merged what is due and the replica follows it (a turn of asks answered "wait" while
    the replica still serves the merged round would be spent for nothing: the turns are bounded, not the time)."""
    wait_for("the holder's merge and the replica's follow",
             lambda: holder.session.done or (not holder.merging and not holder.round_ready()
                                             and replica.session.round == holder.session.round),
             time.monotonic() + WAIT_SECONDS)


@pytest.mark.timeout(300)
def test_a_replica_of_a_sync_session_hands_out_units_and_the_holder_judges_what_it_takes(
        package: Package, tmp_path: Path, postgresql_url: str) -> None:
    holder = make_relay(package, tmp_path / "s", k=2, passes=2, store=postgresql_url, ban_addresses=False,
                        verify_fraction=0.0, verify_every=0)
    replica = replica_of(holder, postgresql_url)
    assert holder.store.shared and not holder.context.replica and replica.context.replica
    with contextlib.ExitStack() as holding, serving(replica) as b:
        a = holding.enter_context(serving(holder))
        peers = [HttpPeer(b), HttpPeer(a)]  # (joined at either relay: the store knows them both)
        first = peers[0].assignment()  # (the replica leases round 1's first unit in the database)
        assert first["round"] == 0 and holder.store.lease(0, first["slot"]) is not None
        junk = peers[0].upload(first["round"], first["slot"], b"not a weights message")  # (judged by the holder)
        assert (junk.status_code, junk.json()["error"]) in wire_refusals(), junk.text
        assert session_status(a)["counters"][f"refused.{junk.json()['error']}"] == 1  # (counted there, once)
        assert "refused.not_leased" not in session_status(a)["counters"]  # (the replica's lease, read afresh)
        second = peers[0].assignment()  # (another unit: the holder's refusal is in the store, the replica honours it)
        assert second["round"] == 0 and second["slot"] != first["slot"]
        assert holder.store.slot_refusals(0) == {first["slot"]: frozenset({peers[0].peer_id})}
        accepted = peers[0].upload(second["round"], second["slot"], peers[0].train(second))
        assert accepted.status_code == 200 and accepted.json() == {"accepted": True, "round": 0,
                                                                   "slot": second["slot"]}, accepted.text
        again = peers[0].upload(second["round"], second["slot"], peers[0].train(second))
        assert again.status_code == 409 and again.json()["error"] == "duplicate", again.text
        assert holder.store.result_peer(0, second["slot"]) == peers[0].peer_id  # (kept by the holder)
        for index in range(TURNS):  # (asking one relay, sending to the other, in turn)
            turn(peers, *((a, b) if index % 2 else (b, a)))
            caught_up(holder, replica)
            if holder.session.round >= 3:
                break
        wait_for("the replica to follow the holder's checkpoints",
                 lambda: replica.session.round == holder.session.round, time.monotonic() + WAIT_SECONDS)
        np.testing.assert_array_equal(replica.session.weights, holder.session.weights)
        assert replica.store.forwarded(10) == []  # (every result handed over was judged and its verdict read)
        holding.close()  # the holder stops: the replica serves alone, then holds the session
        replica.sharing.take_hold = lambda: True  # (``serve`` hands it the hold's take: its holder is gone)
        wait_for("the replica to take the session over", lambda: not replica.context.replica,
                 time.monotonic() + WAIT_SECONDS)
        for _ in range(TURNS):
            if session_status(b)["done"]:
                break
            turn(peers, b, b)
        else:
            raise AssertionError(f"the session did not finish: {session_status(b)}")
        final = session_status(b)
    assert final["counters"]["takeovers"] == 1 and final["counters"].get("refused.not_leased", 0) == 0
    results = recorded_results(postgresql_url)
    assert sorted((r.round, r.slot) for r in results) == [(r, s) for r in range(6) for s in range(2)]  # none lost
    np.testing.assert_array_equal(replay(package, replica.session.config, results).weights, replica.session.weights)


def test_a_result_no_holder_judges_is_taken_back_and_refused_503(package: Package, tmp_path: Path,
                                                                 postgresql_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder serves nothing (it stopped, and no relay holds the session yet): after ``FORWARD_SECONDS`` the
    replica takes the result back and answers ``503 holder_unavailable`` with ``Retry-After``; nothing is left for
    a holder to judge later."""
    monkeypatch.setattr(sharing, "FORWARD_SECONDS", 0.5)
    holder = make_relay(package, tmp_path / "s", k=2, passes=2, store=postgresql_url, ban_addresses=False)
    replica = replica_of(holder, postgresql_url)
    with serving(replica) as b:
        peer = HttpPeer(b)
        job = peer.assignment()
        answer = peer.upload(job["round"], job["slot"], peer.train(job))
        assert answer.status_code == 503 and answer.json()["error"] == "holder_unavailable", answer.text
        assert answer.headers["Retry-After"] == "5"
        assert replica.store.forwarded(10) == [] and replica.store.result_slots(0) == set()
        assert session_status(b)["counters"]["refused.holder_unavailable"] == 1
    holder.store.close()


@pytest.mark.timeout(300)
def test_a_replica_hands_out_the_copies_its_holder_wants(package: Package, tmp_path: Path,
                                                        postgresql_url: str) -> None:
    """Every slot copied (``--redundancy 1``), three peers that speak to the replica alone: the replica hands out
    the second copies the holder chose (the holder keeps them in the store), the holder compares what the replica
    hands over, and every round merges with its copies compared, none disputed."""
    holder = make_relay(package, tmp_path / "s", k=2, passes=1, store=postgresql_url, ban_addresses=False,
                        redundancy=1.0, verify=False)
    replica = replica_of(holder, postgresql_url)
    with serving(holder) as a, serving(replica) as b:
        peers = [HttpPeer(b) for _ in range(3)]
        for _ in range(TURNS):
            if holder.session.done:
                break
            turn(peers, b, b)
            caught_up(holder, replica)
        else:
            raise AssertionError(f"the session did not finish: {session_status(a)}")
        counters = session_status(a)["counters"]
    compared = [entry["redundancy"]["compared"] for entry in holder.session.history]
    assert compared == [2] * holder.session.num_rounds, compared  # (both slots of every round, by copies)
    assert counters["copies_handed_out"] == 2 * holder.session.num_rounds and "copies_disputed" not in counters
    assert counters["results_forwarded"] == 4 * holder.session.num_rounds  # (every result and copy, by the replica)


@pytest.mark.timeout(300)
def test_an_ask_held_at_the_replica_wakes_for_a_copy_the_holder_wants(package: Package, tmp_path: Path,
                                                                       postgresql_url: str) -> None:
    """A small copy share (no slot of round 0 chosen by it), both units of round 0 leased at the replica, a third
    peer's ask held there (``hold=``, the browser's way): when the first result, its peer's first, makes the holder
    want a copy of it (no copy has confirmed that peer yet), the held ask wakes with that copy. (It waited out its
    hold: the replica reads the copies afresh at each ask, but nothing woke an ask already held.)"""
    holder = make_relay(package, tmp_path / "s", k=2, passes=1, store=postgresql_url, ban_addresses=False,
                        redundancy=0.01, verify=False)
    replica = replica_of(holder, postgresql_url)
    with serving(holder), serving(replica) as b, ThreadPoolExecutor(1) as pool:
        first, second, third = (HttpPeer(b) for _ in range(3))
        job = first.assignment()
        second.assignment()  # (round 0's other unit)
        held = pool.submit(third.work, MAX_HOLD_SECONDS)
        wait_for("the third peer's ask to be held", lambda: held.done() or replica.context.notices.holding == 1,
                 time.monotonic() + WAIT_SECONDS)
        assert not held.done(), held.result()
        sent = time.monotonic()
        assert first.upload(job["round"], job["slot"], first.train(job)).status_code == 200
        copy = held.result(timeout=MAX_HOLD_SECONDS + WAIT_SECONDS)
        waited = time.monotonic() - sent
    assert (copy.get("round"), copy.get("slot")) == (0, job["slot"]), copy  # (the copy of the first result's unit)
    assert waited < replica.max_hold_seconds / 2, f"the held ask answered {waited:.1f} s after the copy was wanted"
