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


def test_a_merge_waits_for_the_replay_of_one_of_its_oldest_results(package: Package, tmp_path: Path) -> None:
    """The host's replays take long (the test holds each until it lets them go): K results wait and no merge starts
    while one of them waits for its replay; once the verdicts are in, the merge takes the oldest K."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    assert relay.verification.queue is not None
    replays = relay.verification.queue.verifier.replays
    train, gate = replays._train, threading.Event()  # type: ignore[attr-defined]

    def slow(*args: Any) -> Any:
        assert gate.wait(30), "the test never let the replays go"
        return train(*args)

    replays._train = slow  # type: ignore[attr-defined]
    with serving(relay) as client:
        a, b, c = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        jobs = {peer.peer_id: peer.assignment() for peer in (a, b, c)}
        try:
            for peer in (a, b, c):
                assert peer.train_and_upload(jobs[peer.peer_id]).status_code == 200
            status = session_status(client)
            held = dict(relay.mode.checks.held)  # type: ignore[attr-defined]
            assert sorted(held) == sorted(job["slot"] for job in jobs.values()), held
            assert not relay.round_ready() and relay.store.buffered_count() == 3
            assert status["round"] == 0 and status["counters"]["replays_queued"] == 3, status["counters"]
        finally:
            gate.set()
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        oldest = [jobs[peer.peer_id]["slot"] for peer in (a, b)]
        assert status["history"][0]["entries"] == oldest and status["counters"]["results_verified"] >= 2
        wait_until(client, lambda s: s["counters"]["results_verified"] == 3)
        assert not relay.mode.checks.held and relay.store.buffered_count() == 1  # type: ignore[attr-defined]
        assert status["counters"].get("peers_banned", 0) == 0


def test_async_mode_keeps_host_replays_and_says_what_a_ban_undoes(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    resolution = resolve(relay.session.config, relay.options, package)
    assert resolution.options.verify and relay.verification.active
    assert any("host replays judge results against the version each started from" in n for n in resolution.notes)
    assert "a ban undoes nothing merged" in (relay.undo.rules.refusal() or "")
    assert relay.store.leases(ASYNC_ROUND) == {}
