"""Second copies of a unit (``serve --redundancy F``): two honest copies are identical and nothing is arbitrated;
a lying copy, or a lying merged result, is caught by the host's replay that decides; without replays both go
and a third peer trains the unit; one result per unit is merged, never both."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from relay_fixtures import (
    HttpPeer,
    flipped,
    make_relay,
    reference_run,
    serving,
    session_status,
    wait_until,
    work_until_done,
)
from relay_process import wait_for

from runtime import wire
from server.relay.state import Relay
from server.relay.store import open_store
from server.relay.volunteer_key import VolunteerKey
from server.session.package import Package
from server.session.session import Session


def is_copy(relay: Relay, peer: HttpPeer, job: dict[str, Any]) -> bool:
    """Whether ``job`` is ``peer``'s second copy of its slot: the relay's copy lease says so, the job does not (a
    peer must not know that its result is compared)."""
    assert "copy" not in job, job
    lease = relay.store.leases(job["round"], 1).get(job["slot"])
    return lease is not None and lease.peer_id == peer.peer_id


def test_two_honest_copies_are_identical_and_nothing_is_arbitrated(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, redundancy=1.0, verify_fraction=0.0,
                       ban_addresses=False)
    with serving(relay) as client:
        peers = [HttpPeer(client), HttpPeer(client)]
        work_until_done(client, peers)
        counters = session_status(client)["counters"]
    relay.open()  # (the app's lifespan closed the store)
    rounds = relay.session.num_rounds
    assert counters["copies_identical"] == counters["copies_handed_out"] == 2 * rounds, counters
    assert "copies_disputed" not in counters and counters.get("peers_banned", 0) == 0
    assert all(entry["redundancy"] == {"compared": 2, "identical": 2} for entry in relay.session.history)
    # exactly one result per unit merged: the final weights are those of every unit trained once in-process
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))
    copies = relay.store.copies(0)
    merged = relay.store.results(0)
    assert {slot for slot, _ in copies} == set(merged)  # each slot: one merged result and one compared copy
    assert all(peer != merged[slot].peer_id for slot, peer in copies)  # ... from the other peer
    assert {wire.decode(r.message)[0].meta["engine"] for r in merged.values()} == {"native-numpy"}


def test_a_copy_goes_to_another_address_when_addresses_tell_people_apart(package: Package, tmp_path: Path) -> None:
    """With address bans on (``--ban-addresses``) two peers behind one address never train both copies: the copy is
    waived when nobody from elsewhere is connected, and the round still merges."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, redundancy=1.0, verify_fraction=0.0,
                       ban_addresses=True)
    with serving(relay) as client:
        peers = [HttpPeer(client), HttpPeer(client)]  # both from the test client's one address
        work_until_done(client, peers)
        counters = session_status(client)["counters"]
    assert "copies_handed_out" not in counters and counters["copies_waived"] == 2 * relay.session.num_rounds, counters


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_a_lying_copy_is_caught_by_the_replay_that_decides(package: Package, tmp_path: Path, codec: str) -> None:
    """int8 too: two honest copies of an update are the same bytes (the encoding is seeded by the unit)."""
    relay = make_relay(package, tmp_path / "s", k=1, passes=1, redundancy=1.0, verify_fraction=0.0,
                       ban_addresses=False, config={"codec": codec})
    with serving(relay) as client:
        honest, liar, helper = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        job = honest.assignment()
        assert honest.train_and_upload(job).status_code == 200
        wait_until(client, lambda s: s["counters"].get("results_verified", 0) == 1)  # its first result: replayed
        copy = liar.assignment()
        assert copy["slot"] == job["slot"]
        # the liar's first result is replayed anyway (its own first) and the dispute's replay judges it too
        assert liar.upload(copy["round"], copy["slot"], flipped(liar, copy, relay)).status_code == 200
        wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert [r.peer_id for r in relay.store.all_results()] == [honest.peer_id]
        work_until_done(client, [honest, helper])
        status = session_status(client)
    relay.open()
    counters = status["counters"]
    assert counters["copies_disputed"] == 1 and counters["peers_banned"] == 1, counters
    assert relay.store.ban_reason(liar.peer_id) and not relay.store.ban_reason(honest.peer_id)
    assert relay.session.history[0]["redundancy"] == {"compared": 1, "lied": 1}
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))


def test_a_lying_merged_result_is_replaced_by_the_honest_copy(package: Package, tmp_path: Path) -> None:
    """A patient liar: honest in round 0 (its first result passes its replay), then its round-1 result is merged
    first and only the honest copy disagrees; the replay that decides bans it and the copy takes its place. (Replays
    for the coverage bound and for direction off: they would replay the flipped result at once.)"""
    relay = make_relay(package, tmp_path / "s", k=1, passes=1, redundancy=1.0, verify_fraction=0.0,
                       verify_every=0, verify_direction=None, ban_addresses=False)
    with serving(relay) as client:
        liar, honest = HttpPeer(client), HttpPeer(client)
        for round_index in (0, 1):
            job, copy = liar.assignment(), honest.assignment()
            assert (job["round"], copy["slot"]) == (round_index, job["slot"])
            body = liar.train(job) if round_index == 0 else flipped(liar, job, relay)
            assert liar.upload(job["round"], job["slot"], body).status_code == 200
            assert honest.train_and_upload(copy).status_code == 200
            if round_index == 0:
                wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        status = wait_until(client, lambda s: s["round"] >= 2 and not s["merging"])
        assert [r.peer_id for r in relay.store.results(1).values()] == [honest.peer_id]  # one result, the honest
        assert relay.session.history[1]["redundancy"] == {"compared": 1, "replaced": 1}
        helper = HttpPeer(client)
        work_until_done(client, [honest, helper])
    relay.open()
    assert status["counters"]["peers_banned"] == 1 and relay.store.ban_reason(liar.peer_id)
    assert status["counters"]["copies_promoted"] == 1 and status["counters"]["copies_disputed"] == 1
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))


@pytest.mark.parametrize(("codec", "liar_first"), [("none", False), ("int8", False), ("none", True)])
def test_without_replays_a_third_peer_settles_a_dispute_by_quorum(package: Package, tmp_path: Path, codec: str,
                                                                  liar_first: bool) -> None:
    """No host replays: two copies that disagree both go, and the unit goes to a third peer (neither of the two gets
    it again). The third result agrees with the honest one bit for bit: the liar is banned (whether its result was
    the merged one or the copy), the honest copy upheld, the third result merged, and no fourth copy is trained."""
    relay = make_relay(package, tmp_path / "s", k=1, passes=1, redundancy=1.0, verify=False,
                       ban_addresses=False, config={"codec": codec})
    with serving(relay) as client:
        honest, liar, third = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        first, second = (liar, honest) if liar_first else (honest, liar)
        job = first.assignment()
        body = flipped(liar, job, relay) if liar_first else first.train(job)
        assert first.upload(job["round"], job["slot"], body).status_code == 200
        copy = second.assignment()
        assert copy["slot"] == job["slot"]
        body = second.train(copy) if liar_first else flipped(liar, copy, relay)
        assert second.upload(copy["round"], copy["slot"], body).status_code == 200
        counters = session_status(client)["counters"]
        assert counters["copies_disputed"] == counters["disputes_unresolved"] == 1
        assert "slot" not in honest.work()  # neither gets the unit again
        assert session_status(client)["counters"].get("peers_banned", 0) == 0  # (not yet: nobody can tell)
        again = third.assignment()
        assert again["slot"] == job["slot"]
        assert third.train_and_upload(again).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert [r.peer_id for r in relay.store.all_results()] == [third.peer_id]
        assert relay.store.ban_reason(liar.peer_id) and "disagreed with two other peers" in \
            relay.store.ban_reason(liar.peer_id)
        assert relay.session.history[0]["redundancy"] == {"compared": 2, "lied": 1, "upheld": 1}
        assert status["counters"]["disputes_settled_by_quorum"] == 1 and "copies_handed_out" in status["counters"]
        assert status["counters"]["copies_handed_out"] == 1  # (the third result needed no copy of its own)
        assert not relay.store.ban_reason(honest.peer_id) and not relay.store.ban_reason(third.peer_id)
        units = {p["peer_id"]: p["units_done"] for p in relay.store.peers_listing()}
        assert (units[honest.peer_id], units[liar.peer_id], units[third.peer_id]) == (1, 1, 1)
        work_until_done(client, [honest, third])  # (the liar's undone round redone without it: honest weights)
    relay.open()
    assert status["counters"]["peers_banned"] == 1
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))


def test_without_replays_results_that_all_differ_go_to_one_more_peer_until_two_agree(package: Package,
                                                                                     tmp_path: Path) -> None:
    """Two liars who do not collude lie differently: the honest result, a flipped copy, and a third peer's own lie
    (the flip's size, half its signs turned back) all differ, so nothing is settled and the unit goes to a fourth
    peer (``quorums_undecided``). Its honest result agrees with the first: both liars are banned, the first upheld,
    and the fourth merged."""
    relay = make_relay(package, tmp_path / "s", k=1, passes=1, redundancy=1.0, verify=False, ban_addresses=False)
    with serving(relay) as client:
        honest, liar, other_liar, fourth = (HttpPeer(client) for _ in range(4))
        job = honest.assignment()
        assert honest.train_and_upload(job).status_code == 200
        copy = liar.assignment()
        assert liar.upload(copy["round"], copy["slot"], flipped(liar, copy, relay)).status_code == 200
        third = other_liar.assignment()
        assert third["slot"] == job["slot"]
        g = relay.session.weights
        header, trained = wire.decode(other_liar.train(third))
        delta = -2 * (trained - g)
        delta[1::2] *= -1  # (the flip's norm, other bytes)
        lie = wire.encode((g + delta).astype(np.float32), header)
        assert other_liar.upload(third["round"], third["slot"], lie).status_code == 200
        counters = session_status(client)["counters"]
        assert counters["quorums_undecided"] == 1 and counters.get("peers_banned", 0) == 0, counters
        assert not relay.book.stale(0)  # (each dropped result taken out of the round's sum, not summed again)
        last = fourth.assignment()
        assert last["slot"] == job["slot"] and "slot" not in honest.work()  # (none of the three again)
        assert fourth.train_and_upload(last).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert [r.peer_id for r in relay.store.all_results()] == [fourth.peer_id]
        assert all("disagreed with two other peers" in (relay.store.ban_reason(p.peer_id) or "")
                   for p in (liar, other_liar))
        assert not relay.store.ban_reason(honest.peer_id) and not relay.store.ban_reason(fourth.peer_id)
        assert relay.session.history[0]["redundancy"] == {"compared": 3, "lied": 2, "upheld": 1}
        assert status["counters"]["disputes_settled_by_quorum"] == 1 and status["counters"]["peers_banned"] == 2
        work_until_done(client, [honest, fourth])  # (the liars' undone rounds redone without them)
    relay.open()
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))


def test_a_dispute_lost_in_a_restart_is_trained_again(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=1, passes=1, redundancy=1.0, verify=False,
                       ban_addresses=False)
    with serving(relay) as client:
        first, second = HttpPeer(client), HttpPeer(client)
        job = first.assignment()
        assert first.train_and_upload(job).status_code == 200
        copy = second.assignment()
        relay.store.add_copy(copy["round"], copy["slot"], second.peer_id, flipped(second, copy, relay), "disputed")
    restarted = Relay(session=Session.restore(tmp_path / "s", package), package=package,
                      store=open_store(tmp_path / "s" / "relay.sqlite3"), options=relay.options)
    try:
        assert restarted.store.result_slots(0) == set()  # neither result stands
        assert restarted.store.copies(0) == {(job["slot"], second.peer_id): "retrained_after_restart"}
    finally:
        restarted.close()


def test_a_peer_a_copy_confirmed_keeps_its_record_after_a_restart(package: Package, tmp_path: Path) -> None:
    """Round 0: two newcomers' results are copied by a third peer and confirmed. After the relay restarts, their
    round-1 results are not copied again (the seeded share is nil here): the record was read back from the store."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=3, redundancy=1e-9, verify=False, ban_addresses=False)
    with serving(relay) as client:
        first, second, helper = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        for peer in (first, second):
            assert peer.train_and_upload(peer.assignment()).status_code == 200
        for _ in range(2):
            assert helper.train_and_upload(helper.assignment()).status_code == 200
        wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
    restarted = Relay(session=Session.restore(tmp_path / "s", package), package=package,
                      store=open_store(tmp_path / "s" / "relay.sqlite3"), options=relay.options)
    with serving(restarted) as client:
        for peer in (first, second):
            peer.client = client
            assert peer.train_and_upload(peer.assignment()).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 2 and not s["merging"])  # (no copy waited for)
    assert status["counters"]["copies_handed_out"] == 2, status["counters"]


def test_with_trust_copies_fall_with_each_peers_record_and_no_window_goes_unchecked(package: Package,
                                                                                    tmp_path: Path) -> None:
    """Adaptive replication by copies (no host replays): ``--verify-trust 16`` over ``--verify-every 2`` and a share
    of 0.5. A peer's results are copied until a copy confirms one (or it trained a copy that matched); each copy it
    passes then doubles its window (2, 4, 8, 16) and halves its share, so the last rounds copy fewer results than
    the first; and no peer has 16 results in a row without a copy. The peers join with fixed volunteer keys: which
    result of a window is copied is drawn from the peer's identity, and with the random peer ids of anonymous peers
    the last ten rounds' copies varied from run to run (2 measured once, 6 another time)."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=15, redundancy=0.5, verify=False, ban_addresses=False,
                       verify_every=2, verify_trust=16)
    with serving(relay) as client:
        peers = [HttpPeer(client, volunteer=VolunteerKey(ec.derive_private_key(1000 + n, ec.SECP256R1())))
                 for n in range(3)]
        for turn in range(400):  # (as work_until_done, each ask after a due merge is done: who trains what, and so
            if relay.session.done:  # which results are copied, does not depend on how fast the host merges; a
                break  # loaded host's slower merges shifted the turns, and the first ten rounds copied 5, not 7)
            for peer in peers[turn % 3:] + peers[:turn % 3]:
                wait_for("a due merge", lambda: not relay.merging and not relay.round_ready(),
                         time.monotonic() + 60)
                job = peer.work(2)
                if "slot" in job:
                    assert peer.train_and_upload(job).status_code == 200
        assert relay.session.done, session_status(client)
        counters = session_status(client)["counters"]
        audit = relay.store.audit()
    compared = [entry["redundancy"]["compared"] for entry in relay.session.history]
    print("copies compared per round:", compared)
    # (measured: 7 copies in the first ten rounds and 2 in the last ten; without trust 13 and 10)
    assert len(compared) == 30 and sum(compared[-10:]) <= 5 < sum(compared[:10]), compared
    assert "copies_disputed" not in counters and "peers_banned" not in counters, counters
    for peer in peers:
        checked = [row["verification"].startswith("copy") for row in audit if row["peer_id"] == peer.peer_id]
        assert checked, peer.peer_id
        longest = max(len(run) for run in "".join("x" if c else "." for c in checked).split("x"))
        assert longest < 16, checked


def test_redundancy_out_of_range_is_refused_by_serve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli import main

    assert main(["serve", "--port", "0", "--redundancy", "1.5", "--session-dir", str(tmp_path / "s")]) == 2
    assert "--redundancy must be a share between 0 and 1" in capsys.readouterr().err


def test_a_new_peers_results_are_copied_until_a_copy_confirms_one(package: Package, tmp_path: Path) -> None:
    """With copies on, every result of a peer none of whose results a copy has confirmed is copied, whatever the
    seeded share (here next to none): the first round's two results are, the second round's (the same two peers,
    now confirmed) are not. A newcomer that lies from its first result has that result copied: the copy disagrees,
    a third peer's result settles it, and the newcomer is banned in the round it first uploaded."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=3, redundancy=1e-9, verify=False, ban_addresses=False)
    with serving(relay) as client:
        first, second, helper = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        assert relay.session.num_rounds >= 3
        jobs = [first.assignment(), second.assignment()]
        for peer, job in zip((first, second), jobs, strict=True):
            assert peer.train_and_upload(job).status_code == 200
        for _ in jobs:  # the round waits for both copies; the idle peer trains them
            copy = helper.assignment()
            assert is_copy(relay, helper, copy) and copy["round"] == 0
            assert helper.train_and_upload(copy).status_code == 200
        wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        for peer in (first, second):
            assert peer.train_and_upload(peer.assignment()).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 2 and not s["merging"])  # (no copy waited for)
        assert status["counters"]["copies_handed_out"] == 2
        assert [entry["redundancy"] for entry in relay.session.history] == [{"compared": 2, "identical": 2},
                                                                            {"compared": 0}]
        newcomer = HttpPeer(client)
        lie, honest = newcomer.assignment(), first.assignment()
        assert newcomer.upload(lie["round"], lie["slot"], flipped(newcomer, lie, relay)).status_code == 200
        assert first.train_and_upload(honest).status_code == 200
        copy = helper.assignment()
        assert is_copy(relay, helper, copy) and copy["slot"] == lie["slot"]
        assert helper.train_and_upload(copy).status_code == 200  # disputed: nobody can replay it
        third = second.assignment()
        assert third["slot"] == lie["slot"] and not is_copy(relay, second, third)
        assert second.train_and_upload(third).status_code == 200  # agrees with the copy: the newcomer lied
        status = wait_until(client, lambda s: s["round"] >= 3 and not s["merging"])
        assert "disagreed with two other peers" in (relay.store.ban_reason(newcomer.peer_id) or "")
        assert status["counters"]["peers_banned"] == 1 and status["counters"]["copies_handed_out"] == 3


def test_two_newcomers_that_agree_do_not_outvote_a_peer_with_a_record(package: Package, tmp_path: Path) -> None:
    """One cheating client run by two newcomers gives the same wrong bytes twice. A confirmed peer's copy of one
    newcomer's lie disagrees; the unit goes to the other newcomer, whose identical lie agrees with the first: two
    newcomers against a peer with a record ban nobody (``quorums_against_a_record``), and the slot is copied again."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=3, redundancy=1e-9, verify=False, ban_addresses=False)
    with serving(relay) as client:
        first, second, helper = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        jobs = [first.assignment(), second.assignment()]
        for peer, job in zip((first, second), jobs, strict=True):
            assert peer.train_and_upload(job).status_code == 200
        for _ in jobs:
            assert helper.train_and_upload(helper.assignment()).status_code == 200  # all three confirmed
        wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        cheat, twin = HttpPeer(client), HttpPeer(client)
        lie, honest = cheat.assignment(), first.assignment()
        assert cheat.upload(lie["round"], lie["slot"], flipped(cheat, lie, relay)).status_code == 200
        assert first.train_and_upload(honest).status_code == 200  # (confirmed: not copied)
        copy = helper.assignment()
        assert is_copy(relay, helper, copy) and copy["slot"] == lie["slot"]
        assert helper.train_and_upload(copy).status_code == 200  # disputed
        third = twin.assignment()
        assert third["slot"] == lie["slot"]
        assert twin.upload(third["round"], third["slot"], flipped(twin, third, relay)).status_code == 200
        counters = session_status(client)["counters"]
        assert counters["quorums_against_a_record"] == 1 and counters.get("peers_banned", 0) == 0, counters
    relay.open()
    assert not any(relay.store.ban_reason(p.peer_id) for p in (helper, cheat, twin))
