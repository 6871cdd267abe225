"""Central DP on the relay, over HTTP: host replays compare a peer's result before clipping and noise, so honest
peers pass them and nobody is banned; the history, the status and the exported model carry the accountant's epsilon
after each round; the admin API refuses DP settings that cannot hold and leaves the session as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from relay_fixtures import ADMIN_TOKEN, HttpPeer, make_relay, serving, session_status, work_until_done

from runtime.aggregate import Mean
from runtime.merge import FedAdam, Result
from server.session import accountant
from server.session.export import metadata_of
from server.session.package import Package
from server.session.privacy import PrivateAggregation

# Two peers' mean with noise std 1.5 x 0.5 / 2 per weight: in about one run of ten the noise alone takes the
# validation loss past 3x its best, and the divergence guard would stop the session early (it is not tested here).
DP = {"aggregate": "mean", "dp_noise_multiplier": 1.5, "dp_clip": 0.5, "divergence_factor": 1e6}


def test_replays_pass_and_every_round_records_its_epsilon(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=2, config=DP, verify=True, verify_fraction=1.0)
    with serving(relay) as client:
        peers = [HttpPeer(client) for _ in range(2)]
        work_until_done(client, peers)
        status = session_status(client)
        model = client.get("/api/admin/export/model", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    counters = status["counters"]
    assert counters.get("peers_banned", 0) == 0 and counters["results_verified"] == 8, counters
    # 4 units, k = 2, 2 passes: each unit is in one round per pass
    epsilons = [entry["privacy"]["epsilon"] for entry in status["history"]]
    assert epsilons == pytest.approx([accountant.epsilon(1.5, n, 1e-6) for n in (1, 1, 2, 2)])
    assert status["privacy"]["epsilon"] == pytest.approx(epsilons[-1])
    assert status["privacy"]["planned_epsilon"] == pytest.approx(epsilons[-1])
    said = json.loads(metadata_of(model.content)["privacy"])
    assert said["enabled"] is True and said["rounds"] == 4 and said["epsilon"] == pytest.approx(epsilons[-1])


def test_the_admin_api_refuses_dp_settings_that_cannot_hold(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=1)
    with serving(relay) as client:
        before = session_status(client)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for body, words in (({"dp_noise_multiplier": 1.0, "aggregate": "median", "replace": True}, "no such bound"),
                            ({"dp_clip": 0.5, "replace": True}, "needs differential privacy's noise"),
                            ({"dp_noise_multiplier": -1, "replace": True}, "dp_noise_multiplier must be")):
            answer = client.post("/api/admin/session", json=body, headers=headers)
            assert answer.status_code in (400, 422) and words in answer.json()["message"], answer.json()
        after = session_status(client)
    assert after["privacy"] == before["privacy"] and after["fingerprint"] == before["fingerprint"]
    assert after["aggregate"] == before["aggregate"]


def test_dp_composes_with_a_stateful_server_optimizer() -> None:
    """The server optimizer steps with the noisy average of the clipped updates: FedAdam's pseudo-gradient is exactly
    what the DP stage returned, minus the global weights."""
    g = np.zeros(50)
    results = [Result((g + v).astype(np.float32), 10) for v in (np.full(50, 1.0), np.full(50, -0.2), np.full(50, 0.05))]
    stage = PrivateAggregation(inner=Mean(), contributors=["a", "b", "c"], clip=0.3, noise_multiplier=1.0,
                               rng=np.random.default_rng(4))
    replay = PrivateAggregation(inner=Mean(), contributors=["a", "b", "c"], clip=0.3, noise_multiplier=1.0,
                                rng=np.random.default_rng(4))
    adam = FedAdam()
    adam.merge(g, results, aggregator=stage)
    noisy = replay.combine(g, [r.weights for r in results], [10, 10, 10])
    assert adam.last_delta is not None and np.allclose(adam.last_delta, noisy - g, atol=1e-12)
    assert stage.report["noise_std"] == pytest.approx(1.0 * 0.3 / 3)
