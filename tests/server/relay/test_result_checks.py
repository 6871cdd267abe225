"""Counts the relay knows, update checks relative to the round, freed slots, aggregators chosen by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from relay_fixtures import (
    ADMIN_TOKEN,
    HttpPeer,
    make_relay,
    serving,
    session_status,
    wait_for_round,
)

from runtime import wire
from runtime.tasks import WorkUnit
from runtime.tasks.cartpole import CartPoleTask
from server.relay.checks import relay_count
from server.relay.client import RelayRefusal
from server.relay.refusal import Refusal
from server.session.config import SessionConfig, SessionError
from server.session.package import Package
from server.session.session import Session


def counters(client) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return dict(session_status(client)["counters"])


def reencoded(message: bytes, vector: np.ndarray | None = None, **changes: object) -> bytes:
    header, decoded = wire.decode(message)
    return wire.encode(decoded if vector is None else vector, dataclasses.replace(header, **changes))


def test_the_merge_weighs_a_data_unit_by_the_relays_count(package: Package, tmp_path: Path) -> None:
    """The majority task's chunks hold 9 numbers a row: 2304 numbers are 256 examples, whatever is claimed."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, min_peers=1)
    with serving(relay) as client:
        a = HttpPeer(client)
        job = a.assignment()
        honest = a.train(job)
        assert wire.decode(honest)[0].num_examples == 256
        modest = reencoded(honest, num_examples=3)  # an under-claim is not refused, and not believed either
        assert a.upload(job["round"], job["slot"], modest).status_code == 200
        assert [r.num_examples for r in relay.store.all_results()] == [256]


def test_an_inflated_claim_is_refused_counted_and_frees_the_slot(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1)
    with serving(relay) as client:
        liar, honest = HttpPeer(client), HttpPeer(client)
        job = liar.assignment()
        response = liar.upload(job["round"], job["slot"], reencoded(liar.train(job), num_examples=10**9))
        assert response.status_code == 422 and response.json()["error"] == "num_examples_claim"
        assert "holds 256 examples" in response.json()["message"]
        assert counters(client)["refused.num_examples_claim"] == 1
        assert relay.store.leases(0).get(job["slot"]) is None  # freed at once, not after the lease
        taken = honest.assignment()
        assert taken["slot"] == job["slot"]  # the honest peer gets the freed slot first
        with pytest.raises(RelayRefusal) as banned:  # an honest runtime never over-claims: the liar is banned
            liar.work()
        assert (banned.value.status, banned.value.code) == (403, "banned")
        assert honest.train_and_upload(taken).status_code == 200
        assert relay.store.all_results()[0].peer_id == honest.peer_id


def test_an_experience_units_claim_is_capped_by_the_task() -> None:
    task = CartPoleTask({"episodes_per_unit": 4})
    unit = WorkUnit(index=0, seed=1, episodes=4)
    assert task.max_examples_per_unit() == 2000
    assert relay_count(task, unit, 2000) == 2000 and relay_count(task, unit, 37) == 37
    with pytest.raises(Refusal) as refused:
        relay_count(task, unit, 2001)
    assert (refused.value.status, refused.value.code) == (422, "num_examples_claim")
    with pytest.raises(Refusal) as refused:
        relay_count(task, unit, 0)
    assert refused.value.code == "num_examples"


def test_an_update_far_above_the_rounds_median_is_refused(package: Package, tmp_path: Path) -> None:
    """Two honest results in; a third whose update is 4x flipped is more than 3x their median norm."""
    relay = make_relay(package, tmp_path / "s", k=4, passes=1)
    with serving(relay) as client:
        peers = [HttpPeer(client) for _ in range(4)]
        jobs = [peer.assignment() for peer in peers]
        for peer, job in zip(peers[:2], jobs[:2], strict=True):
            assert peer.train_and_upload(job).status_code == 200
        attacker, job = peers[2], jobs[2]
        header, trained = wire.decode(attacker.train(job))
        global_weights = relay.session.weights
        flipped = (global_weights - 4 * (trained - global_weights)).astype(np.float32)
        response = attacker.upload(job["round"], job["slot"], wire.encode(flipped, header))
        assert response.status_code == 422 and response.json()["error"] == "update_outlier"
        assert "median" in response.json()["message"]
        scaled = (global_weights + 1.5 * (trained - global_weights)).astype(np.float32)  # within 3x: accepted
        own = peers[3].assignment()  # the peer's own lease, still held
        assert own["slot"] == jobs[3]["slot"]
        assert peers[3].upload(own["round"], own["slot"], wire.encode(scaled, header)).status_code == 200
        assert counters(client)["refused.update_outlier"] == 1
        assert counters(client)["slots_freed_by_refusal"] == 1


def test_the_relative_check_waits_for_enough_results(package: Package, tmp_path: Path) -> None:
    """The first result of a round has nothing to be compared with: only the absolute bound applies."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, outlier_min_results=2, min_peers=1)
    with serving(relay) as client:
        a = HttpPeer(client)
        job = a.assignment()
        header, trained = wire.decode(a.train(job))
        far = (relay.session.weights + 20 * (trained - relay.session.weights)).astype(np.float32)
        assert a.upload(job["round"], job["slot"], wire.encode(far, header)).status_code == 200


def test_the_aggregator_is_chosen_by_name_and_kept_in_the_session(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, config={"aggregate": "median"})
    with serving(relay) as client:
        assert relay.session.describe()["aggregate"] == "median"
        peers = [HttpPeer(client), HttpPeer(client)]
        for peer in peers:
            assert peer.train_and_upload().status_code == 200
        status = wait_for_round(client, 1)
        assert status["aggregate"] == "median" and "outliers" in status["history"][-1]
        assert any("median" in line for line in status["defenses"]["guards"])
        assert "a majority of dishonest peers" in status["defenses"]["not_covered"]
    restored = Session.restore(tmp_path / "s", package)
    assert restored.config.aggregate == "median" and restored.aggregator.name == "median"


def test_the_default_is_a_robust_aggregator_and_old_sessions_keep_the_mean() -> None:
    assert SessionConfig().aggregate == "centered_clipping" and SessionConfig().aggregate_config == {}
    assert SessionConfig(aggregate="trimmed_mean").aggregate_config == {}  # its own defaults
    stored = SessionConfig(merge="fedavg").to_json()
    del stored["aggregate"], stored["aggregate_config"]
    assert SessionConfig.from_json(stored).aggregate == "mean"


def test_centered_clipping_state_survives_a_restart(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, config={"aggregate": "centered_clipping"})
    with serving(relay) as client:
        for peer in [HttpPeer(client), HttpPeer(client)]:
            assert peer.train_and_upload().status_code == 200
        wait_for_round(client, 1)
        center = relay.session.aggregator.state_dict()["center"]
    restored = Session.restore(tmp_path / "s", package)
    assert np.array_equal(restored.aggregator.state_dict()["center"], center)


def test_krum_needs_more_results_than_its_assumption(package: Package) -> None:
    with pytest.raises(SessionError, match="needs more than 4 results"):
        Session(package, SessionConfig(participants=4, passes=1, aggregate="krum", aggregate_config={"f": 1},
                                       force=True))


def test_the_admin_api_switches_the_aggregator(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1)
    with serving(relay) as client:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        response = client.post("/api/admin/session", headers=admin, json={"aggregate": "median", "replace": True})
        assert response.status_code == 200, response.text
        assert relay.session.config.aggregate == "median" and relay.session.config.aggregate_config == {}
        bad = client.post("/api/admin/session", headers=admin, json={"aggregate": "nonsense", "replace": True})
        assert (bad.status_code, bad.json()["error"]) == (422, "bad_session")
        message = bad.json()["message"]  # (the settings' one wording: the setting, its choices, the value given)
        assert "aggregate must be one of" in message and "centered_clipping" in message and "nonsense" in message
