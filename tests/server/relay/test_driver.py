"""The relay's transport-free API (``Relay.join``, ``peer``, ``next_work``, ``submit_result``, ``merge_ready``): a
session driven through it alone, with no HTTP and no event loop, as the virtual-clock simulator drives it; the relay
does its own counting, and a refusal is counted once whether it came through the API or through HTTP."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from relay_fixtures import ADMIN_TOKEN, HttpPeer, make_relay, reference_run, serving

from runtime.peer import Peer
from runtime.protocol import Done, Job
from server.relay.book import RoundBook
from server.relay.refusal import Refusal
from server.relay.state import Relay
from server.relay.store import StoredResult
from server.session.config import SessionConfig
from server.session.package import Package


def drive(relay: Relay, package: Package, peers: list[tuple[str, str]], trainers: list[Peer], limit: int = 200) -> int:
    """Each peer in turn asks for work, trains it natively and submits it; the driver merges what is ready after
    every event. Returns the steps taken (bounded by ``limit``)."""
    for step in range(limit):
        if relay.session.done:
            return step
        for (peer_id, token), trainer in zip(peers, trainers, strict=True):
            job = relay.next_work(relay.peer(peer_id, token))
            if isinstance(job, Job):
                trainer.set_weights(relay.weights_of(job.weights_round))
                relay.submit_result(peer_id, job.round, job.slot,
                                    trainer.train(job, package.chunk_bytes(job.unit_index)))
            relay.merge_ready()
    raise AssertionError(f"the session did not finish in {limit} steps: {relay.status()['round_progress']}")


def test_a_session_driven_through_the_api_alone_equals_the_in_process_run(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=2, verify=False)
    peers = [relay.join("127.0.0.1", agent=f"driver {i}") for i in range(2)]
    trainers = [Peer(package.task_description()) for _ in peers]
    drive(relay, package, peers, trainers)
    counters = relay.store.counters()
    units = relay.session.plan.num_rounds * 2
    assert relay.session.done and len(relay.session.history) == relay.session.plan.num_rounds
    assert counters["results_accepted"] == units and not any(name.startswith("refused.") for name in counters)
    assert np.array_equal(reference_run(package, SessionConfig(participants=2, passes=2)), relay.session.weights)
    assert relay.next_work(peers[0][0]) == Done("the session is complete")
    relay.close()


def test_a_refusal_is_counted_once_through_the_api_and_through_http(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=3, passes=1, verify=False, min_peers=1)  # (3 slots: no merge)
    peer_id, token = relay.join("127.0.0.1")
    job = relay.next_work(relay.peer(peer_id, token))
    trainer = Peer(package.task_description())
    trainer.set_weights(relay.weights_message())
    body = trainer.train(job, package.chunk_bytes(job.unit_index))
    relay.submit_result(peer_id, job.round, job.slot, body)
    with pytest.raises(Refusal) as refused:
        relay.submit_result(peer_id, job.round, job.slot, body)
    assert refused.value.code == "duplicate" and relay.store.counters()["refused.duplicate"] == 1
    with pytest.raises(Refusal) as wrong:
        relay.peer(peer_id, "not-the-token")
    assert (wrong.value.status, wrong.value.code) == (401, "unauthorized")
    with serving(relay) as client:  # the same refusal through HTTP: the handler does not count it again
        http = HttpPeer(client)
        job = http.assignment()
        trained = http.train(job)
        assert http.upload(job["round"], job["slot"], trained).status_code == 200
        again = http.upload(job["round"], job["slot"], trained)
        assert (again.status_code, again.json()["error"]) == (409, "duplicate")
        counters = client.get("/api/session").json()["counters"]
        assert counters["refused.duplicate"] == 2 and counters["results_accepted"] == 2
        assert client.get("/api/admin/peers", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200


def test_the_round_book_forgets_merged_rounds_and_keeps_results_without_their_messages() -> None:
    book = RoundBook()
    vector = np.arange(3, dtype=np.float32)
    book.keep(StoredResult(2, 1, 7, "p-1", 10, {}, b"message"), vector)
    kept = book.kept(2, 1)
    assert kept is not None and kept[0].message == b"" and kept[1] is vector
    book.add_norm(1, 0.5)
    book.add_norm(2, 1.5)
    book.refuse(1, 0, "p-2")
    book.refuse(2, 0, "p-3", "p-4")
    book.forget_before(2)
    assert book.norms(1) == [] and book.norms(2) == [1.5]
    assert not book.refused(1, 0, "p-2") and book.refused(2, 0, "p-4") and not book.refused(2, 1, "p-4")
    assert book.take(2, 1) is not None and book.take(2, 1) is None
