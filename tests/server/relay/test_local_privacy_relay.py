"""Local differential privacy, a volunteer's own choice on a local task: the peer clips its update and adds Gaussian
noise before the upload (``runtime.privacy.privatize_update``), with secret randomness; the relay holds such a
result to the bound its noise reaches instead of the round's median (which its noise alone would exceed), refuses a
claim of noise that does not fit, and the status lists each noise choice's epsilon per upload (dp-accounting)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from relay_fixtures import HttpPeer, make_relay, serving, session_status, wait_for_round

from runtime import wire
from runtime.peer import Peer
from runtime.privacy import noise_bound, privatize_update
from runtime.protocol import Job
from runtime.tasks import TaskError
from server.session import accountant
from server.session.package import Package, build_package

REPO_ROOT = Path(__file__).resolve().parents[3]
CSV_TASK = REPO_ROOT / "examples" / "csv_task.py"
DATA = REPO_ROOT / "examples" / "data" / "csv"
PEER_FILES = [DATA / "peers" / f"peer-{n}" / "rows.csv" for n in (1, 2, 3)]


@pytest.fixture(scope="module")
def csv_package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    return build_package(str(CSV_TASK), {"units": 3, "epochs": 2, "validation_file": str(DATA / "validation.csv")},
                         tmp_path_factory.mktemp("csv") / "package", log=lambda _: None)


class LocalPeer(HttpPeer):
    def __init__(self, client: httpx.Client, path: Path) -> None:
        super().__init__(client)
        assert self.peer.local is not None
        self.peer.local.add(path.name, path.read_bytes())


def test_privatize_update_clips_then_adds_noise_of_z_c() -> None:
    base = np.zeros(20_000, np.float32)
    trained = base + 0.01  # norm 1.41, clipped to 0.5
    out = privatize_update(base, trained, 2.0, 0.5, np.random.default_rng(3)).astype(np.float64)
    clipped = np.full(20_000, 0.01) * 0.5 / math.sqrt(20_000 * 1e-4)
    assert np.std(out - clipped) == pytest.approx(2.0 * 0.5, rel=0.02)
    assert np.linalg.norm(out) <= noise_bound(2.0, 0.5, 20_000)


def test_a_peer_with_local_privacy_sends_a_fresh_noisy_update_and_no_losses(csv_package: Package) -> None:
    peer = Peer(csv_package.task_description())
    assert peer.local is not None
    peer.local.add("rows.csv", PEER_FILES[0].read_bytes())
    peer.set_weights(wire.encode(csv_package.initial_weights, wire.WireHeader(
        spec=peer.spec, round=0, fingerprint=csv_package.fingerprint, num_examples=0)))
    job = Job(round=0, slot=0, pass_index=0, unit_index=0, unit_seed=5, kind="local", episodes=0, progress=0.0,
              lease_deadline=0.0, lease_seconds=60.0, weights_round=0, num_rounds=1,
              fingerprint=csv_package.fingerprint)
    plain = [wire.decode(peer.train(job))[1] for _ in range(2)]
    assert np.array_equal(plain[0], plain[1])  # without noise a unit is a deterministic function, as before
    peer.set_local_privacy(1.0, 0.5)
    (one_header, one), (_, two) = (wire.decode(peer.train(job)) for _ in range(2))
    assert not np.array_equal(one, two)  # the noise is drawn from secret randomness each time, not from the unit
    assert set(one_header.metrics) == {"seconds"} and one_header.meta["local_dp"] == {"noise_multiplier": 1.0,
                                                                                       "clip": 0.5}
    peer.set_local_privacy(0.0, 0.5)
    assert np.array_equal(wire.decode(peer.train(job))[1], plain[0])
    with pytest.raises(TaskError, match="noise multiplier >= 0 and a clip > 0"):
        peer.set_local_privacy(1.0, 0.0)


def header_of(peer: LocalPeer, job: dict[str, Any], **meta: Any) -> wire.WireHeader:
    return wire.WireHeader(spec=peer.peer.spec, round=job["round"], fingerprint=peer.peer.fingerprint,
                           num_examples=320, meta={"slot": job["slot"], "unit_index": job["unit_index"], **meta})


def test_the_relay_takes_a_noised_result_within_its_bound_and_refuses_a_claim_that_does_not_fit(
        csv_package: Package, tmp_path: Path) -> None:
    relay = make_relay(csv_package, tmp_path / "session", k=3, passes=2, config={"seed": 1})
    with serving(relay) as client:
        status = session_status(client)
        listed = {c["noise_multiplier"]: c["epsilon"] for c in status["privacy"]["local"]["choices"]}
        assert status["privacy"]["enabled"] is False and status["privacy"]["local"]["clip"] == 1.0
        assert listed[1.0] == pytest.approx([accountant.epsilon(1.0, n, 1e-6) for n in range(1, 41)])
        peers = [LocalPeer(client, path) for path in PEER_FILES]
        jobs = [peer.assignment() for peer in peers]
        for peer, job in zip(peers[:2], jobs[:2], strict=True):
            assert peer.train_and_upload(job).status_code == 200
        # A forged claim: a small noise said, a far longer update sent. (A refused slot goes to another peer.)
        forger, weights = peers[2], relay.session.weights
        forged = wire.encode(weights + 5.0, header_of(forger, jobs[2], local_dp={"noise_multiplier": 0.1, "clip": 0.1}))
        refused = forger.upload(0, jobs[2]["slot"], forged)
        assert refused.status_code == 422 and refused.json()["error"] == "update_norm"
        careless = LocalPeer(client, PEER_FILES[2])
        job = careless.assignment()
        malformed = wire.encode(weights, header_of(careless, job, local_dp={"noise_multiplier": -1, "clip": 1}))
        answer = careless.upload(0, job["slot"], malformed)
        assert answer.status_code == 422 and answer.json()["error"] == "local_dp"
        noisy = LocalPeer(client, PEER_FILES[2])
        noisy.peer.set_local_privacy(4.0, 1.0)
        job = noisy.assignment()
        body = noisy.train(job)
        norm = float(np.linalg.norm(wire.decode(body)[1].astype(np.float64) - weights))
        median = float(np.median(relay.book.norms(0)))
        assert norm > 3 * median  # the round's outlier check would have refused it
        assert noisy.upload(0, job["slot"], body).status_code == 200
        entry = wait_for_round(client, 1)["history"][0]
        assert entry["participants"] == 3
