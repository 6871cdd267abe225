"""Results as compressed updates (``SessionConfig.codec``): peers send int8 or topk updates, the relay adds them to
the round's weights, replays and the simulator agree bit for bit, and wrong updates are refused with their codes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from relay_fixtures import HttpPeer, make_relay, serving, work_until_done

from runtime import wire
from runtime.codec import Codec
from server.relay.options import RelayOptions
from server.session.config import SessionConfig
from server.session.package import Package
from server.session.rules import resolve
from server.session.settings import SessionError
from server.simulation.sweep_worker import train_session


def simulated(package: Package, **config: object) -> np.ndarray:
    return train_session(package, SessionConfig(**config), None).weights  # type: ignore[arg-type]


def test_int8_updates_with_replays_end_on_the_simulators_weights(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, verify=True, verify_fraction=1.0,
                       config={"codec": "int8"})
    with serving(relay) as client:
        peers = [HttpPeer(client) for _ in range(2)]
        job = peers[0].assignment()
        assert job["codec"] == {"name": "int8", "block": 256}
        body = peers[0].train(job)
        size = relay.session.spec.size  # 354 weights: 3 bytes saved on each, less 2 scales and the codec's header
        as_weights = wire.encode(relay.session.weights, wire.read_header(body))
        assert wire.is_update(body) and len(as_weights) - len(body) >= 3 * size - 100
        assert peers[0].upload(job["round"], job["slot"], body).status_code == 200
        work_until_done(client, peers)
        counters = client.get("/api/session").json()["counters"]
    assert not any(name.startswith("refused.") for name in counters), counters
    assert counters["results_verified"] >= 8 and "verification_failed" not in counters  # the same bytes replayed
    assert np.array_equal(relay.session.weights, simulated(package, participants=2, passes=2, codec="int8"))


def test_topk_with_error_feedback_ends_on_the_simulators_weights(package: Package, tmp_path: Path) -> None:
    """One slot per round, so the one simulated peer and the one real peer carry the same residual."""
    relay = make_relay(package, tmp_path / "s", k=1, passes=2, verify=False,
                       config={"codec": "topk", "topk_fraction": 0.1})
    with serving(relay) as client:
        peer = HttpPeer(client)
        work_until_done(client, [peer])
        assert np.abs(peer.peer.feedback.residual).sum() > 0  # it carried something from unit to unit
    expected = simulated(package, participants=1, passes=2, codec="topk", topk_fraction=0.1)
    assert np.array_equal(relay.session.weights, expected)
    assert not np.array_equal(expected, simulated(package, participants=1, passes=2))  # the codec mattered


def test_wrong_updates_are_refused_with_their_codes(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, verify=False, config={"codec": "int8"})
    with serving(relay) as client:
        peer = HttpPeer(client)
        job = peer.assignment()
        honest = peer.train(job)
        header = wire.read_header(honest)
        weights = relay.session.weights
        codec = Codec("int8")
        payload = codec.encode(np.zeros_like(weights), seed=1)
        other_base = wire.encode_update(payload, header, codec, wire.weights_digest(weights + 1))
        as_weights = wire.encode(weights, header)
        as_topk = wire.encode_update(Codec("topk").encode(np.ones_like(weights), 1), header, Codec("topk"),
                                     wire.weights_digest(weights))
        cut = wire.encode_update(payload[:-4], header, codec, wire.weights_digest(weights))
        for body, status, code in ((other_base, 409, "wrong_base"), (as_weights, 422, "wrong_codec"),
                                   (as_topk, 422, "wrong_codec"), (cut, 422, "wrong_codec")):
            answer = peer.upload(job["round"], job["slot"], body)
            assert (answer.status_code, answer.json()["error"]) == (status, code), answer.json()
            job = peer.assignment()  # (a refused result frees its slot: lease it again)
        assert peer.upload(job["round"], job["slot"], peer.train(job)).status_code == 200
        assert relay.store.counters()["results_accepted"] == 1


def test_an_update_to_a_session_of_weights_is_refused(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, verify=False)
    with serving(relay) as client:
        peer = HttpPeer(client)
        job = peer.assignment()
        header = wire.read_header(peer.train(job))
        codec = Codec("int8")
        body = wire.encode_update(codec.encode(np.zeros(relay.session.spec.size, np.float32), 1), header, codec,
                                  wire.weights_digest(relay.session.weights))
        answer = peer.upload(job["round"], job["slot"], body)
        assert (answer.status_code, answer.json()["error"]) == (422, "wrong_codec")


def test_topk_is_refused_where_replays_or_copies_would_judge_it(package: Package) -> None:
    options = RelayOptions(admin_token="t", verify=True)
    with pytest.raises(SessionError, match="int8"):
        resolve(SessionConfig(codec="topk"), options, package, force_verify=True)
    with pytest.raises(SessionError, match="--redundancy"):
        resolve(SessionConfig(codec="topk"), dataclasses.replace(options, verify=False, redundancy=0.5), package)
    resolved = resolve(SessionConfig(codec="topk"), dataclasses.replace(options, verify=False), package)
    assert resolved.config.codec == "topk"
    assert resolve(SessionConfig(codec="int8"), options, package).options.verify  # int8 keeps the replays
