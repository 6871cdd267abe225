"""Backup units (``serve --backup-after F``): once every unit of a round is out, an idle peer races the unit in
flight longest; the first result is merged, the slow original is compared (a free check) and never merged, a
lying backup is caught, and a round never waits for a backup."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import (
    HttpPeer,
    PausedHistory,
    flipped,
    make_relay,
    reference_run,
    serving,
    session_status,
    wait_until,
    work_until_done,
)

from runtime import wire
from server.relay.options import DEFAULT_BACKUP_AFTER
from server.session.package import Package


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """6 chunks of 256 rows (the ``package`` fixture of conftest.py builds it once for this module)."""
    return {"examples": 1536, "chunks": 6}


def test_a_backup_races_and_wins_and_the_slow_original_is_compared_not_merged(package: Package,
                                                                               tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=3, passes=1, backup_after=0.0, ban_addresses=False)
    with serving(relay) as client:
        fast, slow, other, idle = (HttpPeer(client) for _ in range(4))
        jobs = {peer.peer_id: peer.assignment() for peer in (fast, slow, other)}
        assert fast.train_and_upload(jobs[fast.peer_id]).status_code == 200
        backup = idle.assignment()  # every unit is out: the one in flight longest is the slow peer's
        assert (backup["slot"], backup["copy"]) == (jobs[slow.peer_id]["slot"], "backup")
        assert idle.train_and_upload(backup).status_code == 200  # the backup wins the race
        assert slow.train_and_upload(jobs[slow.peer_id]).status_code == 200  # compared, not merged
        assert other.train_and_upload(jobs[other.peer_id]).status_code == 200
        wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        merged = relay.store.results(0)
        assert merged[backup["slot"]].peer_id == idle.peer_id and len(merged) == 3
        assert relay.store.copies(0) == {(backup["slot"], slow.peer_id): "identical"}
        assert relay.session.history[0]["backups"] == {"units": [backup["unit_index"]],
                                                       "won": [backup["unit_index"]]}
        assert relay.session.history[0]["participants"] == 3  # one result per unit
        work_until_done(client, [fast, slow, other, idle])
        counters = session_status(client)["counters"]
    assert counters["backups_won"] >= 1 and counters.get("peers_banned", 0) == 0, counters
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))


def test_a_lying_backup_is_caught_by_the_comparison(package: Package, tmp_path: Path) -> None:
    """(Replays for the coverage bound and for direction off: the flipped lie would be replayed at once.)"""
    relay = make_relay(package, tmp_path / "s", k=3, passes=1, backup_after=0.0, verify_fraction=0.0,
                       verify_every=0, verify_direction=None, ban_addresses=False)
    with serving(relay) as client:
        first, slow, other, liar = (HttpPeer(client) for _ in range(4))
        assert relay.verification.queue is not None
        relay.verification.queue.first_queued.add(liar.peer_id)  # (a liar whose first result was honest, long ago)
        job, slow_job, other_job = first.assignment(), slow.assignment(), other.assignment()
        assert first.train_and_upload(job).status_code == 200
        backup = liar.assignment()
        assert backup["slot"] == slow_job["slot"] and backup["copy"] == "backup"
        assert liar.upload(backup["round"], backup["slot"], flipped(liar, backup, relay)).status_code == 200
        # the lie was merged first; the original disagrees with it, a replay decides, the original takes its place
        assert slow.train_and_upload(slow_job).status_code == 200
        assert other.train_and_upload(other_job).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert relay.store.ban_reason(liar.peer_id) and not relay.store.ban_reason(slow.peer_id)
        assert relay.store.results(0)[slow_job["slot"]].peer_id == slow.peer_id
        assert status["counters"]["copies_disputed"] == 1 and status["counters"]["copies_promoted"] == 1
        work_until_done(client, [first, slow, other])
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))


def test_no_backup_before_a_unit_is_slower_than_the_median(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, ban_addresses=False,
                       backup_after=DEFAULT_BACKUP_AFTER)  # serve's default: 1x the median unit time
    with serving(relay) as client:
        first, slow, idle = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        job, _ = first.assignment(), slow.assignment()
        assert "slot" not in idle.work()  # no unit back yet: no yardstick, no backup
        started = time.time()
        assert first.train_and_upload(job).status_code == 200
        took = time.time() - started
        median = relay.copies.backups.backup_after_seconds()
        assert median is not None and median >= took * 0.5
        time.sleep(max(0.0, median - (time.time() - started)) + 0.05)  # the slow unit is out longer than that
        assert idle.work()["copy"] == "backup"


def test_backups_can_be_turned_off(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, backup_after=None, ban_addresses=False)
    with serving(relay) as client:
        first, _slow, idle = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        _slow.assignment()
        assert first.train_and_upload(first.assignment()).status_code == 200
        assert "slot" not in idle.work()


def test_a_held_request_wakes_when_a_unit_crosses_the_backup_threshold(package: Package, tmp_path: Path) -> None:
    """A browser holds its work request up to 15 s; a unit becoming slow enough for a backup wakes it then."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, ban_addresses=False,
                       backup_after=DEFAULT_BACKUP_AFTER)
    with serving(relay) as client:
        first, slow, idle = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        job, _ = first.assignment(), slow.assignment()
        assert first.train_and_upload(job).status_code == 200
        threshold = relay.copies.backups.backup_after_seconds()
        assert threshold is not None and threshold < 5
        asked = time.monotonic()
        answer = idle.work(hold=15)
        assert answer.get("copy") == "backup", answer
        assert time.monotonic() - asked < threshold + 3  # woken by the threshold, not by the end of the hold


def test_an_honest_backup_that_won_is_not_banned_when_the_original_lies(package: Package, tmp_path: Path) -> None:
    """The original holder is slow and lies (1.5x its update); the honest backup's result was merged first.
    The dispute's replay judges both: only the liar is banned, the backup stays merged."""
    relay = make_relay(package, tmp_path / "s", k=3, passes=1, backup_after=0.0, verify_fraction=0.0,
                       ban_addresses=False)
    with serving(relay) as client:
        first, liar, other, idle = (HttpPeer(client) for _ in range(4))
        job, liar_job, other_job = first.assignment(), liar.assignment(), other.assignment()
        assert first.train_and_upload(job).status_code == 200
        assert relay.verification.queue is not None
        relay.verification.queue.first_queued.add(idle.peer_id)  # (its first result was checked long ago)
        backup = idle.assignment()
        assert backup["slot"] == liar_job["slot"] and backup["copy"] == "backup"
        assert idle.train_and_upload(backup).status_code == 200  # the backup wins the race
        header, trained = wire.decode(liar.train(liar_job))
        g = relay.session.weights
        lie = wire.encode((g + 1.5 * (trained - g)).astype(np.float32), header)
        assert liar.upload(liar_job["round"], liar_job["slot"], lie).status_code == 200  # compared: disputed
        assert other.train_and_upload(other_job).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert relay.store.ban_reason(liar.peer_id) and not relay.store.ban_reason(idle.peer_id), status["counters"]
        assert relay.store.results(0)[liar_job["slot"]].peer_id == idle.peer_id
        work_until_done(client, [first, other, idle])
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))


def test_when_both_copies_of_a_unit_lie_both_are_banned_and_an_honest_peer_trains_it(package: Package,
                                                                                    tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=3, passes=1, backup_after=0.0, verify_fraction=0.0,
                       ban_addresses=False)
    with serving(relay) as client:
        first, liar, other, backup_liar = (HttpPeer(client) for _ in range(4))
        assert relay.verification.queue is not None
        job, liar_job, other_job = first.assignment(), liar.assignment(), other.assignment()
        assert first.train_and_upload(job).status_code == 200
        relay.verification.queue.first_queued.add(backup_liar.peer_id)
        backup = backup_liar.assignment()
        assert backup["slot"] == liar_job["slot"] and backup["copy"] == "backup"
        assert backup_liar.upload(backup["round"], backup["slot"], flipped(backup_liar, backup, relay)).status_code \
            == 200
        header, trained = wire.decode(liar.train(liar_job))
        g = relay.session.weights
        lie = wire.encode((g + 1.5 * (trained - g)).astype(np.float32), header)
        assert liar.upload(liar_job["round"], liar_job["slot"], lie).status_code == 200
        wait_until(client, lambda s: s["counters"].get("peers_banned", 0) >= 2)
        assert other.train_and_upload(other_job).status_code == 200
        assert relay.store.ban_reason(liar.peer_id) and relay.store.ban_reason(backup_liar.peer_id)
        work_until_done(client, [first, other])
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_a_copy_that_comes_while_its_round_merges_is_refused_not_judged_against_the_next_round(
        package: Package, tmp_path: Path, codec: str) -> None:
    """The slow original of a unit whose backup won comes while the round's merge runs in its worker thread, which
    holds the merged weights already and has not counted the round yet (the test holds it there). It is refused
    (``409 past_deadline``), nothing of it is stored and nobody is banned. Before, it was judged as a copy of the
    open round against whatever of the merge had happened: here accepted and compared (none), or refused as
    ``wrong_base`` (int8: its update names its round's weights, not the merged ones); where its early read came before
    the merged weights, decoded against them, found to disagree and replayed against them (the next round's unit),
    which failed both honest peers (a classroom run of 42 browsers banned one so)."""
    relay = make_relay(package, tmp_path / "s", k=3, passes=1, backup_after=0.0, ban_addresses=False,
                       config={"codec": codec})
    history = relay.session.history = PausedHistory(relay.session.history)
    with serving(relay) as client:
        fast, slow, other, idle = (HttpPeer(client) for _ in range(4))
        jobs = {peer.peer_id: peer.assignment() for peer in (fast, slow, other)}
        assert fast.train_and_upload(jobs[fast.peer_id]).status_code == 200
        backup = idle.assignment()
        assert (backup["slot"], backup["copy"]) == (jobs[slow.peer_id]["slot"], "backup")
        assert idle.train_and_upload(backup).status_code == 200  # the backup wins the race
        late = slow.train(jobs[slow.peer_id])
        assert other.train_and_upload(jobs[other.peer_id]).status_code == 200  # the round is full: it merges
        assert history.entered.wait(30), "the round never merged"
        try:
            answer = slow.upload(0, backup["slot"], late)
        finally:
            history.go.set()
        assert (answer.status_code, answer.json().get("error")) == (409, "past_deadline"), answer.text
        wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert relay.store.copies(0) == {} and relay.store.results(0)[backup["slot"]].peer_id == idle.peer_id
        work_until_done(client, [fast, slow, other, idle])
        counters = session_status(client)["counters"]
    assert counters.get("peers_banned", 0) == 0 and counters.get("copies_disputed", 0) == 0, counters
    np.testing.assert_array_equal(relay.session.weights, reference_run(package, relay.session.config))
