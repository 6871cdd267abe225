"""Host replays in async mode (``server.relay.arrival_checks``): a replayed result is held out of the merges until its
verdict, a liar is banned by its first result's replay and nothing of it is merged (its units go out again), a ban
drops its peer's results still in the buffer, and a merge takes the oldest K results whatever order the verdicts
come in."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import HttpPeer, flipped, make_relay, recorded_arrivals, serving, session_status, wait_until

from server.relay.store.records import ASYNC_ROUND
from server.session.buffered import replay
from server.session.package import Package
from server.session.rules import resolve
from server.session.session import Session

ASYNC = {"mode": "async", "aggregate": "mean"}


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """6 chunks of 256 rows (the ``package`` fixture of conftest.py builds it once for this module)."""
    return {"examples": 1536, "chunks": 6}


def held_replays(relay: Any) -> threading.Event:
    """The host's replays of ``relay`` wait until the test sets the event it returns (they take long)."""
    assert relay.verification.queue is not None
    replays = relay.verification.queue.verifier.replays
    train, gate = replays._train, threading.Event()

    def slow(*args: Any) -> Any:
        assert gate.wait(30), "the test never let the replays go"
        return train(*args)

    replays._train = slow
    return gate


def test_a_liar_is_banned_by_its_first_results_replay_and_nothing_of_it_is_merged(package: Package,
                                                                                  tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    with serving(relay) as client:
        a, b, liar = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        jobs = {peer.peer_id: peer.assignment() for peer in (a, liar, b)}
        lie = flipped(liar, jobs[liar.peer_id], relay)
        assert liar.upload(0, jobs[liar.peer_id]["slot"], lie).status_code == 200  # (it passes the size checks)
        assert a.train_and_upload(jobs[a.peer_id]).status_code == 200  # two wait: the lie is one of the oldest K
        status = wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1)
        assert status["round"] == 0 and relay.store.ban_reason(liar.peer_id), status["counters"]
        assert "differs from the host's replay" in (relay.store.ban_reason(liar.peer_id) or "")
        assert status["counters"]["results_dropped_by_ban"] == 1
        assert not relay.store.arrived(jobs[liar.peer_id]["slot"])  # its unit goes out again
        assert b.train_and_upload(jobs[b.peer_id]).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert sorted(status["history"][0]["entries"]) == sorted([jobs[a.peer_id]["slot"], jobs[b.peer_id]["slot"]])
        for _ in range(60):  # the honest peers train what is left, the liar's unit included
            if session_status(client)["done"]:
                break
            for peer in (a, b):
                job = peer.work(hold=5)
                if "slot" in job:
                    assert peer.train_and_upload(job).status_code == 200
        status = session_status(client)
        assert status["done"] and not relay.store.ban_reason(a.peer_id) and not relay.store.ban_reason(b.peer_id)
    relay.open()
    arrivals = recorded_arrivals(relay.store)
    assert sorted(x.entry for x in arrivals) == list(range(len(relay.session.plan.schedule)))  # each unit once
    with sqlite3.connect(relay.store.location) as db:  # (nothing of it is kept)
        assert liar.peer_id not in {row[0] for row in db.execute("SELECT peer_id FROM arrivals")}
    assert status["counters"]["results_verified"] >= 2
    replayed = replay(Session.create(package, relay.session.config), arrivals, exponent=0.5, validate_every=1)
    np.testing.assert_array_equal(replayed.weights, relay.session.weights)  # the honest arrivals, bit for bit


def test_no_merge_starts_while_fewer_than_k_results_passed_their_replays(package: Package, tmp_path: Path) -> None:
    """The host's replays take long (the test holds each until it lets them go): three results wait, each for its
    replay, and no merge starts; once the verdicts are in, the merge takes K of them in arrival order (the first K
    that passed: a result waiting for its replay holds up no merge of the others)."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    gate = held_replays(relay)
    with serving(relay) as client:
        a, b, c = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        jobs = {peer.peer_id: peer.assignment() for peer in (a, b, c)}
        try:
            for peer in (a, b, c):
                assert peer.train_and_upload(jobs[peer.peer_id]).status_code == 200
            status = session_status(client)
            held = dict(relay.mode.checks.held)  # type: ignore[attr-defined]
            assert sorted(held) == sorted((job["slot"], peer) for peer, job in jobs.items()), held
            assert not relay.round_ready() and relay.store.buffered_count() == 3
            assert status["round"] == 0 and status["counters"]["replays_queued"] == 3, status["counters"]
        finally:
            gate.set()
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        order, entries = [jobs[peer.peer_id]["slot"] for peer in (a, b, c)], status["history"][0]["entries"]
        assert len(entries) == 2 and entries == sorted(set(entries), key=order.index), (entries, order)
        assert status["counters"]["results_verified"] >= 2
        wait_until(client, lambda s: s["counters"]["results_verified"] == 3)
        assert not relay.mode.checks.held and relay.store.buffered_count() == 1  # type: ignore[attr-defined]
        assert status["counters"].get("peers_banned", 0) == 0


def test_a_banned_peers_late_verdict_does_not_release_the_unit_another_peer_trained_again(package: Package,
                                                                                          tmp_path: Path) -> None:
    """Every result is replayed, one replay at a time, each as the test lets it go. The liar's first replay fails:
    its results still in the buffer go and their units out again, to an honest peer, whose results wait for their own
    replays. The liar's replay of one of those units, still running, fails after that: it bans nobody more and
    releases nothing of the honest peer's, which waits for its own verdict."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False, verify_fraction=1.0,
                       replay_workers=1)
    assert relay.verification.queue is not None
    replays = relay.verification.queue.verifier.replays
    train, gates = replays._train, [threading.Event() for _ in range(8)]  # type: ignore[attr-defined]
    calls: list[int] = []

    def slow(*args: Any) -> Any:
        calls.append(len(calls))
        assert gates[calls[-1]].wait(30), f"the test never let replay {calls[-1]} go"
        return train(*args)

    replays._train = slow  # type: ignore[attr-defined]
    with serving(relay) as client:
        liar, honest = HttpPeer(client), HttpPeer(client)
        lies = []
        for _ in range(2):  # (replays 0 and 1: the liar's two results, both held)
            job = liar.assignment()
            assert liar.upload(0, job["slot"], flipped(liar, job, relay)).status_code == 200
            lies.append(job["slot"])
        held = relay.mode.checks.held  # type: ignore[attr-defined]
        assert set(held) == {(entry, liar.peer_id) for entry in lies}
        gates[0].set()  # the liar's first replay fails: banned, both its results out of the buffer
        wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1)
        assert relay.store.buffered_count() == 0 and not held
        trained = []
        for _ in range(2):  # (replays 2 and 3, queued behind the liar's second)
            job = honest.assignment()
            assert honest.train_and_upload(job).status_code == 200
            trained.append(job["slot"])
        assert sorted(trained) == sorted(lies) and set(held) == {(entry, honest.peer_id) for entry in lies}
        gates[1].set()  # the liar's second replay fails now
        wait_until(client, lambda s: s["counters"].get("verification_failed", 0) == 2)
        assert set(held) == {(entry, honest.peer_id) for entry in lies} and relay.session.round == 0
        for gate in gates[2:]:
            gate.set()
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert sorted(status["history"][0]["entries"]) == sorted(lies) and not held
        assert status["counters"]["peers_banned"] == 1 and not relay.store.ban_reason(honest.peer_id)


def test_async_mode_keeps_host_replays_and_says_what_a_ban_undoes(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    resolution = resolve(relay.session.config, relay.options, package)
    assert resolution.options.verify and relay.verification.active
    assert any("host replays judge results against the version each started from" in n for n in resolution.notes)
    assert "a ban undoes nothing merged" in (relay.undo.rules.refusal() or "")
    assert relay.store.leases(ASYNC_ROUND) == {}


def test_a_result_held_for_its_replay_when_the_relay_stops_is_replayed_after_the_restart(package: Package,
                                                                                        tmp_path: Path) -> None:
    """A liar's first result waits for its replay (held up by the test) when the relay stops. The restarted relay
    replays it again (the store keeps what it waits for) instead of merging it unchecked: the liar is banned and
    nothing of it is merged."""
    from server.relay.state import Relay
    from server.relay.store import open_store

    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    gate = held_replays(relay)
    try:
        with serving(relay) as client:
            liar, a = HttpPeer(client), HttpPeer(client)
            job = liar.assignment()
            assert liar.upload(0, job["slot"], flipped(liar, job, relay)).status_code == 200
            assert list(relay.mode.checks.held) == [(job["slot"], liar.peer_id)]  # type: ignore[attr-defined]
    finally:
        gate.set()  # (its verdict reaches no relay: that one has stopped)
    again = Relay(session=Session.restore(tmp_path / "s", package), package=package,
                  store=open_store(tmp_path / "s" / "relay.sqlite3"), options=relay.options)
    with serving(again) as client:
        assert again.store.counters()["held_arrivals_held_again_on_start"] == 1
        status = wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1)
        assert "differs from the host's replay" in (again.store.ban_reason(liar.peer_id) or "")
        assert status["counters"]["results_dropped_by_ban"] == 1 and not again.store.arrived(job["slot"])
        a.client = client
        for _ in range(40):
            if session_status(client)["done"]:
                break
            turn = a.work(hold=5)
            if "slot" in turn:
                assert a.train_and_upload(turn).status_code == 200
        assert session_status(client)["done"]
    with sqlite3.connect(again.store.location) as db:
        assert liar.peer_id not in {row[0] for row in db.execute("SELECT peer_id FROM arrivals")}
