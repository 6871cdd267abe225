"""Weights by digest (``GET /api/weights/<digest>``), chains of compressed steps
(``GET /api/weights/<digest>/from/<held>``) in sync and async sessions and across a restart, their cache headers,
and gzip on JSON answers.

A session with a compressing codec moves its weights by the decoded step of each merge; a peer holding earlier
weights rebuilds the newest bit for bit from the relay's chain, and the relay's own check (an update names the
digest of the weights it is against) would refuse every upload trained on anything else."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import httpx
import numpy as np
from relay_fixtures import HttpPeer, make_relay, serving, wait_until, work_until_done

from runtime import deltas, wire
from server.relay.client import RelayClient, content, named_weights_call
from server.relay.state import Relay
from server.relay.store import open_store
from server.session.package import Package
from server.session.session import Session

IMMUTABLE = "public, max-age=31536000, immutable"


def test_weights_by_digest_are_immutable_cacheable_and_need_no_credentials(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, verify=False)
    with serving(relay) as client:
        peer = HttpPeer(client)
        job = peer.assignment()
        digest = job["weights_digest"]
        assert job["weights_url"] == f"/api/weights/{digest}"
        answer = client.get(job["weights_url"])  # (no Authorization header)
        assert answer.status_code == 200 and answer.headers["cache-control"] == IMMUTABLE
        assert answer.headers["etag"] == f'"{digest}"'
        assert answer.content == peer.weights()  # the same message as the peer-only GET /api/weights
        _, vector = wire.decode(answer.content)
        assert hashlib.sha256(vector.astype("<f4").tobytes()).hexdigest() == digest
        assert "content-encoding" not in answer.headers  # binary messages go as they are
        cached = client.get(job["weights_url"], headers={"If-None-Match": f'W/"x", "{digest}"'})
        assert cached.status_code == 304 and cached.content == b"" and cached.headers["etag"] == f'"{digest}"'
        for wrong in ("0" * 64, "xyz", digest.upper(), digest + "0"):
            refused = client.get(f"/api/weights/{wrong}")
            assert (refused.status_code, refused.json()["error"]) == (404, "unknown_weights"), wrong
        # A session that does not compress keeps no steps: a chain is a redirect to the full weights.
        moved = client.get(f"/api/weights/{digest}/from/{'1' * 64}", follow_redirects=False)
        assert moved.status_code == 307 and moved.headers["location"] == job["weights_url"]
        assert moved.headers["cache-control"] == "no-store"
        # JSON answers are gzip-compressed for a client that takes it (the status is several kilobytes).
        status = client.get("/api/session", headers={"Accept-Encoding": "gzip"})
        assert status.headers["content-encoding"] == "gzip" and status.json()["round"] == 0
        raw = client.get("/api/openapi.json", headers={"Accept-Encoding": "gzip"})
        assert raw.headers["content-encoding"] == "gzip"
        assert len(gzip.compress(raw.content)) < len(raw.content)


def rebuild(peer: HttpPeer, job: dict) -> bytes:
    """What a browser does: the chain from the weights held (or the full weights), applied in the peer."""
    message = RelayClient(peer.client).call(named_weights_call(job["weights_digest"], peer.peer.weights_sha))
    peer.peer.set_weights(message)
    return bytes(message)


def test_peers_rebuild_every_round_from_the_relays_steps_bit_for_bit(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=3, verify=False, config={"codec": "int8"})
    held: dict[int, tuple[str, np.ndarray]] = {}  # round -> (digest, weights) as the relay served them
    with serving(relay) as client:
        peers = [HttpPeer(client) for _ in range(2)]
        full = len(peers[0].weights())
        kinds = []
        for _ in range(40):
            if client.get("/api/session").json()["done"]:
                break
            for peer in peers:
                job = peer.work(hold=5)  # (held while the relay merges: "wait"s at once ran out under load)
                if "slot" not in job:
                    continue
                held.setdefault(job["round"], (job["weights_digest"], relay.session.weights.copy()))
                message = rebuild(peer, job)
                kinds.append((deltas.is_chain(message), len(message)))
                assert peer.peer.weights_sha == job["weights_digest"]
                unit = peer.unit(job["unit_index"])
                response = peer.upload(job["round"], job["slot"], peer.peer.train(job, unit))
                assert response.status_code == 200, response.json()  # (a wrong rebuild: 409 wrong_base)
        counters = client.get("/api/session").json()["counters"]
        rounds = relay.session.round
        assert relay.session.done and rounds == 6
        chains = [size for is_chain, size in kinds if is_chain]
        assert len(chains) == 2 * (rounds - 1) and max(chains) < full / 1.5  # every round after the first
        assert counters["weights_sent_chain"] == len(chains) and counters["weights_sent_full"] == 2
        # Each round moved by exactly its step: the history says how many bytes, and how far from the merge.
        downloads = [entry["download"] for entry in relay.session.history]
        assert all(d["codec"] == "int8" and 0 < d["error"] < 0.05 for d in downloads)
        # A peer two rounds behind gets two steps; the relay's weights are what they add up to.
        final = deltas.weights_sha256(relay.session.weights)
        old_digest, old_weights = held[rounds - 2]
        two = RelayClient(client).call(named_weights_call(final, old_digest))
        round_index, rebuilt = deltas.apply_chain(two, old_weights, spec=relay.session.spec,
                                                  fingerprint=package.fingerprint)
        assert round_index == rounds and np.array_equal(rebuilt, relay.session.weights) and len(two) < full
        # Three steps of this small model are more bytes than its weights: the relay sends the weights instead.
        moved = client.get(f"/api/weights/{final}/from/{held[rounds - 3][0]}", follow_redirects=False)
        assert moved.status_code == 307
        cached = client.get(f"/api/weights/{final}/from/{old_digest}",
                            headers={"If-None-Match": f'"{final}-from-{old_digest}"'})
        assert cached.status_code == 304
        assert content(client.get(f"/api/weights/{final}")) == relay.weights_message()
    assert not any(name.startswith("refused.") for name in counters), counters


def test_steps_are_the_same_with_every_peer_rebuilding_as_the_simulator_merges(package: Package,
                                                                                 tmp_path: Path) -> None:
    """The relay's session with downloads as steps ends on the weights of the same session driven by peers that
    fetch full weights: what a peer downloads does not change what it trains on."""
    relay = make_relay(package, tmp_path / "a", k=2, passes=2, verify=False, config={"codec": "int8"})
    with serving(relay) as client:
        work_until_done(client, [HttpPeer(client) for _ in range(2)])
    other = make_relay(package, tmp_path / "b", k=2, passes=2, verify=False, config={"codec": "int8"})
    with serving(other) as client:
        peers = [HttpPeer(client) for _ in range(2)]
        for _ in range(40):
            if client.get("/api/session").json()["done"]:
                break
            for peer in peers:
                job = peer.work(hold=5)  # (held while the relay merges: "wait"s at once ran out under load)
                if "slot" in job:
                    rebuild(peer, job)
                    assert peer.upload(job["round"], job["slot"],
                                       peer.peer.train(job, peer.unit(job["unit_index"]))).status_code == 200
        assert client.get("/api/session").json()["done"]
    assert np.array_equal(relay.session.weights, other.session.weights)


def test_async_peers_rebuild_from_steps_across_versions(package: Package, tmp_path: Path) -> None:
    """Async mode: a peer whose job names an older kept version gets it by digest, and one holding an older version
    gets the chain of the merges since; every update names the weights it trained from and is accepted."""
    relay = make_relay(package, tmp_path / "s", k=1, passes=2, config={"mode": "async", "codec": "int8"},
                       ban_addresses=False)
    with serving(relay) as client:
        slow, fast = HttpPeer(client), HttpPeer(client)
        held = slow.assignment()  # version 0, trained late
        rebuild(slow, held)
        body = slow.peer.train(held, slow.unit(held["unit_index"]))
        for _ in range(2):  # two merges (k = 1) meanwhile
            job = fast.assignment()
            rebuild(fast, job)
            assert fast.upload(job["round"], job["slot"], fast.peer.train(job, fast.unit(job["unit_index"]))) \
                .status_code == 200
            wait_until_round(client, job["round"] + 1)
        assert slow.upload(held["round"], held["slot"], body).status_code == 200  # 2 versions stale, kept
        wait_until_round(client, 3)
        job = slow.assignment()
        message = rebuild(slow, job)  # from version 0 to 3: three steps of this small model, or the full weights
        assert slow.peer.weights_sha == job["weights_digest"] == deltas.weights_sha256(relay.session.weights)
        assert deltas.is_chain(message) == (len(message) < len(relay.weights_message()))
        counters = client.get("/api/session").json()["counters"]
    assert counters["weights_sent_chain"] >= 1 and not any(n.startswith("refused.") for n in counters), counters


def wait_until_round(client: httpx.Client, round_index: int) -> None:
    wait_until(client, lambda s: s["round"] >= round_index and not s["merging"])


def test_after_a_restart_old_holders_get_full_weights_and_new_steps_chain_again(package: Package,
                                                                                  tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=1, passes=3, verify=False, config={"codec": "int8"})
    with serving(relay) as client:
        peer = HttpPeer(client)
        job = peer.assignment()
        rebuild(peer, job)
        round0 = peer.peer.weights_sha
        assert peer.upload(0, job["slot"], peer.peer.train(job, peer.unit(job["unit_index"]))).status_code == 200
        wait_until_round(client, 1)
    restarted = Relay(session=Session.restore(tmp_path / "s", package), package=package,
                      store=open_store(tmp_path / "s" / "relay.sqlite3"), options=relay.options)
    with serving(restarted) as client:
        peer.client = client
        job = peer.assignment()  # round 1: the step from round 0 went with the old process
        assert client.get(f"/api/weights/{job['weights_digest']}/from/{round0}", follow_redirects=False) \
            .status_code == 307
        assert not deltas.is_chain(rebuild(peer, job)) and peer.peer.weights_sha == job["weights_digest"]
        assert peer.upload(1, job["slot"], peer.peer.train(job, peer.unit(job["unit_index"]))).status_code == 200
        wait_until_round(client, 2)
        job = peer.assignment()  # round 2: the step this process took chains again
        assert deltas.is_chain(rebuild(peer, job)) and peer.peer.weights_sha == job["weights_digest"]
