"""Second copies in async mode (``server.relay.arrival_copies``): a newcomer's result is held out of the merges until
another peer has trained its schedule entry from the same version; copies that agree let it merge, copies that
disagree are settled by a third peer (the quorum bans the one that differs, and nothing of it is merged), and a copy
no other peer may train is waived. Host replays are off here: the copies alone check the results."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import (
    ADMIN_TOKEN,
    HttpPeer,
    flipped,
    make_relay,
    recorded_arrivals,
    serving,
    session_status,
    wait_until,
)

from runtime import wire
from server.session.buffered import replay
from server.session.package import Package
from server.session.session import Session

ASYNC = {"mode": "async", "aggregate": "mean"}
COPIES = {"verify": False, "redundancy": 0.01, "ban_addresses": False}  # (a newcomer's every result is copied)


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """6 chunks of 256 rows (the ``package`` fixture of conftest.py builds it once for this module)."""
    return {"examples": 1536, "chunks": 6}


def finish(client: Any, peers: list[HttpPeer], turns: int = 80) -> dict[str, Any]:
    """The peers train what is left, copies included, until the session is done (each ask held until work exists)."""
    for _ in range(turns):
        if session_status(client)["done"]:
            break
        for peer in peers:
            job = peer.work(hold=5)
            if "slot" in job:
                assert peer.train_and_upload(job).status_code == 200, job
    status = session_status(client)
    assert status["done"], status
    return status


def audit(client: Any) -> dict[tuple[int, str], str]:
    """The merged arrivals' audit rows (``GET /api/admin/export/results``): (entry, peer) -> how it was checked."""
    answer = client.get("/api/admin/export/results", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert answer.status_code == 200, answer.text
    rows = [json.loads(line) for line in answer.text.splitlines()]
    assert all(row["round"] >= 0 and row["size"] > 0 and "started_from" in row for row in rows), rows
    return {(row["slot"], row["peer_id"]): row["verification"] for row in rows}


def assert_the_arrivals_replay_to_the_weights(relay: Any, package: Package) -> None:
    relay.open()
    arrivals = recorded_arrivals(relay.store)
    assert sorted(x.entry for x in arrivals) == list(range(len(relay.session.plan.schedule)))  # each unit once
    replayed = replay(Session.create(package, relay.session.config), arrivals, exponent=0.5, validate_every=1)
    np.testing.assert_array_equal(replayed.weights, relay.session.weights)


def test_a_copy_that_agrees_lets_a_newcomers_result_merge(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, **COPIES)
    with serving(relay) as client:
        a, b, c = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        first, other = a.assignment(), c.assignment()
        assert a.train_and_upload(first).status_code == 200
        copies = relay.mode.copies  # type: ignore[attr-defined]
        assert list(copies.waiting) == [first["slot"]] and relay.store.buffered_count() == 1
        assert c.train_and_upload(other).status_code == 200
        assert list(copies.waiting) == [first["slot"], other["slot"]] and not relay.round_ready()
        awaited = [relay.mode.awaited(first["round"], entry) for entry in (first["slot"], other["slot"])]
        assert awaited == [True, True] and not relay.mode.awaited(0, len(relay.session.plan.schedule) - 1)
        leaving = HttpPeer(client)
        assert leaving.assignment()["slot"] == first["slot"]  # (the oldest's copy first)
        assert b.assignment()["slot"] == other["slot"]
        leaving.leave()  # (its copy of the oldest is free again)
        assert b.assignment()["slot"] == other["slot"]  # (asked again: the copy it holds, not the freed one too)
        assert a.assignment()["slot"] not in (first["slot"], other["slot"])  # (never a copy of its own unit: new)
        copy = b.assignment()
        assert (copy["slot"], copy["round"], copy["unit_index"]) == (other["slot"], other["round"],
                                                                       other["unit_index"])
        assert copy.get("copy") is None and copy["weights_digest"] == other["weights_digest"]  # (as any job of it)
        assert b.train_and_upload(copy).status_code == 200
        status = session_status(client)
        assert status["counters"]["copies_identical"] == 1 and list(copies.waiting) == [first["slot"]]
        assert not relay.mode.awaited(copy["round"], other["slot"])  # (its copy is in: an upload like any other)
        assert {relay.store.identity(p) for p in (c.peer_id, b.peer_id)} <= copies.choice.confirmed
        status = finish(client, [a, b, c])
        assert status["counters"].get("peers_banned", 0) == 0
        checked = audit(client)
        assert checked[(other["slot"], c.peer_id)] == f"copy identical (from {b.peer_id})"
        assert len(checked) == len(relay.session.plan.schedule)
        assert all(how.startswith("copy identical (from ") or how == "not checked" for how in checked.values())
        assert checked[(first["slot"], a.peer_id)].startswith("copy identical (from ")  # (the first of each peer)
    with sqlite3.connect(relay.store.location) as db:
        rows = db.execute("SELECT outcome, length(message), sha256 FROM copies WHERE round = -1").fetchall()
    assert rows and {row[0] for row in rows} == {"identical"}, rows
    empty = hashlib.sha256(b"").hexdigest()  # (an identical copy's bytes are not kept, their digest is)
    assert all(size == 0 and len(digest) == 64 and digest != empty for _, size, digest in rows), rows
    assert_the_arrivals_replay_to_the_weights(relay, package)


def test_an_agreeing_copy_is_told_by_identities_taken_as_the_results_arrived(package: Package, tmp_path: Path) -> None:
    """Each result's weights identity is taken in the worker thread that reads it as it arrives; a copy whose
    identity and engine class are its first result's is identical without the first being read back from the store
    on the event loop (SQLite's own trace of the relay's connection while the copy is taken: no message read). Copies
    whose bytes differ are decoded and compared (the liar's test below)."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, **COPIES)
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        job = a.assignment()
        assert a.train_and_upload(job).status_code == 200
        waiting = relay.mode.copies.waiting[job["slot"]]  # type: ignore[attr-defined]
        stored = relay.store.unmerged_arrival(job["slot"])
        assert stored is not None and waiting.identity is not None and waiting.identity[0]  # (an engine class)
        header = wire.read_header(stored[1])
        assert waiting.identity == (header.meta["engine_class"], wire.result_parts(
            stored[1], relay.session.weights, codec=relay.session.config.result_codec).identity)
        copy = b.assignment()
        assert (copy["slot"], copy["round"]) == (job["slot"], job["round"])
        seen: list[str] = []
        relay.store.connection.db.set_trace_callback(seen.append)
        try:
            assert b.train_and_upload(copy).status_code == 200
        finally:
            relay.store.connection.db.set_trace_callback(None)
        assert session_status(client)["counters"]["copies_identical"] == 1
        assert seen and not [statement for statement in seen if "arrival_messages" in statement
                             and statement.lstrip().upper().startswith("SELECT")], seen


def test_a_result_held_for_its_copy_is_passed_over_by_one_merge_and_the_next_waits_for_it(
        package: Package, tmp_path: Path) -> None:
    """A newcomer's result waits for its copy, which a peer holds and has not sent; the confirmed peers' results that
    came after it merge without it once (K of them no check holds: a slow copy in a crowd held every merge behind
    it), and the stream moves past ``--max-staleness`` versions meanwhile, keeping the version the held result started
    from. The next merge waits for it (passed over again, it would land ever staler: a small session whose first
    results all waited for their replays merged them 3-5 versions late and diverged); once its copy agrees, that merge
    takes it, weighted by its staleness, and the records replay to the weights."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config={**ASYNC, "max_staleness": 0}, **COPIES)
    copies = relay.mode.copies  # type: ignore[attr-defined]
    with serving(relay) as client:
        a, b, c, d = HttpPeer(client), HttpPeer(client), HttpPeer(client), HttpPeer(client)
        first = c.assignment()
        assert c.train_and_upload(first).status_code == 200
        copy = b.assignment()
        assert copy["slot"] == first["slot"] and b.train_and_upload(copy).status_code == 200  # (c and b confirmed)
        held = a.assignment()
        assert a.train_and_upload(held).status_code == 200 and list(copies.waiting) == [held["slot"]]
        slow = d.assignment()  # (the copy of a's result: d holds it and sends nothing yet)
        assert (slow["slot"], slow["round"]) == (held["slot"], held["round"])
        after = c.assignment()
        assert after["slot"] not in (first["slot"], held["slot"])
        assert c.train_and_upload(after).status_code == 200 and list(copies.waiting) == [held["slot"]]
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert status["history"][0]["entries"] == [first["slot"], after["slot"]]  # (not the held one between them)
        assert list(copies.waiting) == [held["slot"]] and relay.store.buffered_count() == 1
        later = []
        for _ in range(2):
            later.append(c.assignment())
            assert c.train_and_upload(later[-1]).status_code == 200, later
        assert relay.store.buffered_count() == 3 and not relay.mode.ready()  # type: ignore[attr-defined]
        assert held["round"] in relay.mode.versions  # type: ignore[attr-defined]  # (1 version on: past the bound)
        assert d.train_and_upload(slow).status_code == 200 and not copies.waiting
        status = wait_until(client, lambda s: s["round"] >= 2 and not s["merging"])
        assert status["history"][1]["entries"] == [held["slot"], later[0]["slot"]]
        assert status["history"][1]["staleness"] == [1, 0]
        status = finish(client, [a, b, c, d])
        assert status["counters"].get("peers_banned", 0) == 0
    assert_the_arrivals_replay_to_the_weights(relay, package)


def test_a_liar_is_outvoted_by_a_third_peer_and_nothing_of_it_is_merged(package: Package, tmp_path: Path) -> None:
    """The liar's first result is held for its copy; an honest copy disagrees and, with no host replays, neither
    merges: the entry goes out again from the same version to a third peer, whose result agrees with the honest
    copy. The liar is banned, its result never merged, and the honest results replay to the weights bit for bit."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, **COPIES)
    with serving(relay) as client:
        liar, a, c = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        job = liar.assignment()
        entry, version = job["slot"], job["round"]
        assert liar.upload(version, entry, flipped(liar, job, relay)).status_code == 200  # (it passes the size checks)
        copy = a.assignment()
        assert (copy["slot"], copy["round"]) == (entry, version)
        assert a.train_and_upload(copy).status_code == 200
        status = session_status(client)
        assert status["counters"]["copies_disputed"] == 1 and status["counters"]["disputes_unresolved"] == 1
        assert not relay.store.arrived(entry) and relay.store.buffered_count() == 0  # neither is merged
        assert not relay.store.ban_reason(liar.peer_id)
        again = c.assignment()  # the entry again, from the version both started from, before new units (which
        assert (again["slot"], again["round"]) == (entry, version)  # may wait for merges)
        assert session_status(client)["counters"]["disputes_handed_out"] == 1
        assert c.train_and_upload(again).status_code == 200
        status = wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1)
        assert "a quorum of copies" in (relay.store.ban_reason(liar.peer_id) or "")
        assert status["counters"]["disputes_settled_by_quorum"] == 1
        assert relay.store.arrived(entry)
        status = finish(client, [a, c])
        assert not relay.store.ban_reason(a.peer_id) and not relay.store.ban_reason(c.peer_id)
        assert status["counters"]["peers_banned"] == 1
        checked = audit(client)
        assert checked[(entry, c.peer_id)] == f"quorum: agreed with {a.peer_id}, not {liar.peer_id}"
        assert liar.peer_id not in {peer for _, peer in checked}
    with sqlite3.connect(relay.store.location) as db:
        assert liar.peer_id not in {row[0] for row in db.execute("SELECT peer_id FROM arrivals")}
        outcomes = dict(db.execute("SELECT peer_id, outcome FROM copies WHERE round = -1 AND slot = ?", (entry,)))
    assert outcomes == {liar.peer_id: "lied", a.peer_id: "upheld"}, outcomes
    assert_the_arrivals_replay_to_the_weights(relay, package)


def test_a_copy_no_other_peer_may_train_is_waived(package: Package, tmp_path: Path) -> None:
    """One peer alone: its results wait for copies nobody else may train, so the merge takes them unchecked."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, **COPIES)
    with serving(relay) as client:
        a = HttpPeer(client)
        for _ in range(2):
            assert a.train_and_upload(a.assignment()).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert status["counters"]["copies_waived"] == 2 and not relay.mode.copies.waiting  # type: ignore[attr-defined]
        finish(client, [a])
        assert set(audit(client).values()) == {"copy waived (no peer to train it)"}


def test_copies_that_disagree_go_to_the_hosts_replay_which_bans_the_liar(package: Package, tmp_path: Path) -> None:
    """With host replays on, an honest newcomer's first result waits for its replay and for its copy; the copy is a
    lie, and one replay judges both: the liar is banned, the honest result merges, nothing goes out again."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, redundancy=0.01, ban_addresses=False)
    with serving(relay) as client:
        a = HttpPeer(client)
        first = a.assignment()
        assert a.train_and_upload(first).status_code == 200
        liar = HttpPeer(client)
        copy = liar.assignment()
        assert (copy["slot"], copy["round"]) == (first["slot"], first["round"])
        assert liar.upload(copy["round"], copy["slot"], flipped(liar, copy, relay)).status_code == 200
        status = wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1)
        assert "differs from the host's replay" in (relay.store.ban_reason(liar.peer_id) or "")
        assert status["counters"]["copies_disputed"] == 1 and "disputes_unresolved" not in status["counters"]
        wait_until(client, lambda s: not relay.mode.checks.held)  # type: ignore[attr-defined]
        assert relay.store.arrived(first["slot"]) and relay.store.buffered_count() == 1  # (it waits for a merge)
        status = finish(client, [a])
        assert not relay.store.ban_reason(a.peer_id) and status["counters"]["peers_banned"] == 1
        how = audit(client)[(first["slot"], a.peer_id)]  # (its own replay as a first result, and the dispute's)
        assert how.startswith("replay passed (first result of the peer, ") and \
            "; copy disputed, replay passed (two copies of the unit disagree, " in how, how
    with sqlite3.connect(relay.store.location) as db:
        assert dict(db.execute("SELECT peer_id, outcome FROM copies WHERE round = -1")) == {liar.peer_id: "lied"}
    assert_the_arrivals_replay_to_the_weights(relay, package)


def test_two_newcomers_that_agree_do_not_outvote_a_confirmed_peer(package: Package, tmp_path: Path) -> None:
    """Every result is copied (share 1). Two honest peers confirm each other; then two colluding newcomers send the
    same lie for one of them's next unit (a copy, then the third result): they agree, but newcomers never outvote a
    confirmed peer, so the entry goes out once more, the honest peer's result agrees with the confirmed one, and the
    two liars are banned."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, config=ASYNC, verify=False, redundancy=1.0,
                       ban_addresses=False)
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        first = a.assignment()
        assert a.train_and_upload(first).status_code == 200
        assert b.train_and_upload(b.assignment()).status_code == 200  # (the copy of a's: they confirm each other)
        copies = relay.mode.copies  # type: ignore[attr-defined]
        assert {relay.store.identity(p) for p in (a.peer_id, b.peer_id)} <= copies.choice.confirmed
        job = a.assignment()
        assert a.train_and_upload(job).status_code == 200  # (held for its copy: every result is copied)
        liar, accomplice = HttpPeer(client), HttpPeer(client)
        for peer in (liar, accomplice):  # the copy, then the third result: the same lie twice
            lie = peer.assignment()
            assert (lie["slot"], lie["round"]) == (job["slot"], job["round"]), lie
            assert peer.upload(lie["round"], lie["slot"], flipped(peer, lie, relay)).status_code == 200
        status = session_status(client)
        assert status["counters"]["quorums_against_a_record"] == 1 and not status["counters"].get("peers_banned")
        again = b.assignment()  # the entry once more, to a peer that has not trained it
        assert (again["slot"], again["round"]) == (job["slot"], job["round"])
        assert b.train_and_upload(again).status_code == 200
        status = wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 2)
        assert relay.store.ban_reason(liar.peer_id) and relay.store.ban_reason(accomplice.peer_id)
        assert not relay.store.ban_reason(a.peer_id) and not relay.store.ban_reason(b.peer_id)
        finish(client, [a, b])
    assert_the_arrivals_replay_to_the_weights(relay, package)


def restarted(relay: Any, package: Package, tmp_path: Path) -> Any:
    """The relay of ``relay``'s session started again (as ``serve`` does after a kill), on its SQLite file."""
    from server.relay.state import Relay
    from server.relay.store import open_store

    return Relay(session=Session.restore(tmp_path / "s", package), package=package,
                 store=open_store(tmp_path / "s" / "relay.sqlite3"), options=relay.options)


def test_a_result_held_for_its_copy_is_held_again_after_a_restart(package: Package, tmp_path: Path) -> None:
    """A liar's first result waits for its copy when the relay stops. Restarted, the relay holds it again (the
    store keeps what it waits for) instead of merging it unchecked: its copy goes out, disagrees, a third peer
    settles it, and the liar is banned with nothing of it merged."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, **COPIES)
    with serving(relay) as client:
        liar, a = HttpPeer(client), HttpPeer(client)
        job = liar.assignment()
        entry, version = job["slot"], job["round"]
        assert liar.upload(version, entry, flipped(liar, job, relay)).status_code == 200
        assert list(relay.mode.copies.waiting) == [entry]  # type: ignore[attr-defined]
    again = restarted(relay, package, tmp_path)
    with serving(again) as client:
        copies = again.mode.copies  # type: ignore[attr-defined]
        assert list(copies.waiting) == [entry] and again.store.counters()["held_arrivals_held_again_on_start"] == 1
        for peer in (liar, a):
            peer.client = client
        c = HttpPeer(client)
        copy = a.assignment()
        assert (copy["slot"], copy["round"]) == (entry, version)  # (its copy goes out again)
        assert a.train_and_upload(copy).status_code == 200
        third = c.assignment()
        assert (third["slot"], third["round"]) == (entry, version)
        assert c.train_and_upload(third).status_code == 200
        wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1)
        assert "a quorum of copies" in (again.store.ban_reason(liar.peer_id) or "")
        finish(client, [a, c])
        assert liar.peer_id not in {peer for _, peer in audit(client)}
    assert_the_arrivals_replay_to_the_weights(again, package)


def test_a_held_result_whose_version_is_gone_after_a_restart_goes_out_again(package: Package, tmp_path: Path) -> None:
    """A held result started from a version the restarted relay no longer keeps (it keeps the checkpoint's) cannot
    be copied or replayed: it leaves the buffer and its entry goes out again, never merged unchecked."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, config=ASYNC, **COPIES)
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        first = a.assignment()
        assert a.train_and_upload(first).status_code == 200
        assert b.train_and_upload(b.assignment()).status_code == 200  # (the copy: a and b confirm each other)
        liar = HttpPeer(client)
        job = liar.assignment()  # (from version 0)
        for peer in (a, b):  # two confirmed results that are not copied: a merge moves the session on
            for _ in range(3):
                if relay.session.round >= 1:
                    break
                turn_job = peer.work(hold=5)
                if "slot" in turn_job:
                    assert peer.train_and_upload(turn_job).status_code == 200
        wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert job["round"] == 0 < relay.session.round
        assert liar.upload(0, job["slot"], flipped(liar, job, relay)).status_code == 200  # (held: a newcomer's)
        assert job["slot"] in relay.mode.copies.waiting  # type: ignore[attr-defined]
    again = restarted(relay, package, tmp_path)
    with serving(again) as client:
        assert again.store.counters()["held_arrivals_out_again_on_start"] == 1
        assert not again.store.arrived(job["slot"]) and not again.mode.copies.waiting  # type: ignore[attr-defined]
        for peer in (a, b):
            peer.client = client
        finish(client, [a, b])
        assert liar.peer_id not in {peer for _, peer in audit(client)}
    assert_the_arrivals_replay_to_the_weights(again, package)


def test_copies_messages_are_pruned_with_their_entries(package: Package, tmp_path: Path) -> None:
    """``--keep-results 1``: a copy's message goes once its entry's arrival merged before the last merge, as the
    arrival's does (nothing emptied async copies before: the file grew by a result a copy)."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, config=ASYNC, keep_results=1, **COPIES)
    with serving(relay) as client:
        status = finish(client, [HttpPeer(client) for _ in range(3)])
        assert status["counters"].get("peers_banned", 0) == 0
    with sqlite3.connect(relay.store.location) as db:
        rows = db.execute("SELECT a.merge, length(c.message) > 0 FROM copies c JOIN arrivals a ON a.entry = c.slot "
                          "WHERE c.round = -1").fetchall()
    last = relay.session.round - 1
    assert any(merge < last for merge, _ in rows), rows  # (copies of entries merged before the last merge)
    assert all(not kept for merge, kept in rows if merge < last), rows
    assert all(kept for merge, kept in rows if merge >= last), rows
