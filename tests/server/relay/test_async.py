"""Buffered asynchronous mode (``serve --mode async --buffer K``): peers never wait for a round, every K results
are merged with staleness weights ``(1 + s) ** -a`` (checked by hand), the recorded arrivals replay to the same
weights, and a SIGKILL mid-session loses nothing."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from relay_fixtures import (
    HttpPeer,
    PausedHistory,
    make_relay,
    recorded_arrivals,
    serving,
    session_status,
    work_until_done,
)
from relay_process import (
    ADMIN,
    RELAYD_CONFIG,
    PeerThread,
    Relayd,
    UploadGate,
    free_port,
    relayd_options,
    retrying,
    retrying_fails,
    status_when,
)

from runtime import wire
from runtime.protocol import Job, Wait
from server.bench.attack_peers import as_upload, result_weights
from server.relay.app import RelayPaths
from server.relay.store import open_store
from server.session import checkpoint_files as checkpoint
from server.session.buffered import effective_weights, replay, staleness_weight, update_from
from server.session.export import exported_weights
from server.session.package import Package
from server.session.session import Session, SessionConfig

ASYNC = {"mode": "async", "aggregate": "mean"}  # the plain weighted mean, to check merges by hand


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """6 chunks of 256 rows (the ``package`` fixture of conftest.py builds it once for this module)."""
    return {"examples": 1536, "chunks": 6}


def test_staleness_weights_by_hand() -> None:
    assert staleness_weight(0, 0.5) == 1.0 and staleness_weight(3, 0.5) == 0.5 and staleness_weight(1, 1.0) == 0.5
    assert staleness_weight(4, 0.0) == 1.0
    current, update = np.array([1.0, 2.0], np.float32), np.array([4.0, -8.0], np.float32)
    np.testing.assert_array_equal(effective_weights(current, update, 3, 0.5), [3.0, -2.0])
    np.testing.assert_array_equal(update_from(np.array([5.0, 1.0], np.float32), np.array([1.0, 3.0], np.float32)),
                                  [4.0, -2.0])
    with pytest.raises(ValueError):
        staleness_weight(-1, 0.5)


def test_merges_weigh_staleness_as_specified(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    with serving(relay) as client:
        a, b, c = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        jobs = {p.peer_id: p.assignment() for p in (a, b, c)}  # nobody waits: three units out at version 0
        assert [j["round"] for j in jobs.values()] == [0, 0, 0] and len({j["slot"] for j in jobs.values()}) == 3
        w0 = relay.session.weights.astype(np.float64)
        bodies = {p.peer_id: p.train(jobs[p.peer_id]) for p in (a, b, c)}
        for peer in (a, b):
            assert peer.upload(0, jobs[peer.peer_id]["slot"], bodies[peer.peer_id]).status_code == 200
        status = wait_until_version(client, 1)
        result = {p: wire.decode(m) for p, m in bodies.items()}
        # the relay's example counts (a data unit counts what its chunk holds, never the peer's claim)
        n = {p: count_of(relay, jobs[p]) for p in result}

        def by_hand(base: np.ndarray, parts: list[tuple[str, np.ndarray, float]]) -> np.ndarray:
            total = sum(n[p] for p, _, _ in parts)
            return base + sum(n[p] * weight * delta for p, delta, weight in parts) / total

        w1 = by_hand(w0, [(p, result[p][1].astype(np.float64) - w0, 1.0) for p in (a.peer_id, b.peer_id)])
        np.testing.assert_allclose(relay.session.weights, w1, rtol=1e-5, atol=1e-6)
        assert status["history"][0]["staleness"] == [0, 0]
        # c's result started from version 0 and is merged into version 2: one version stale
        job_a = a.assignment()
        assert job_a["round"] == 1
        body_a = a.train(job_a)
        assert c.upload(0, jobs[c.peer_id]["slot"], bodies[c.peer_id]).status_code == 200
        assert a.upload(1, job_a["slot"], body_a).status_code == 200
        status = wait_until_version(client, 2)
        n[a.peer_id] = count_of(relay, job_a)
        w1_stored = status_weights(relay, 1)
        w2 = by_hand(w1_stored, [(c.peer_id, result[c.peer_id][1].astype(np.float64) - w0, 2 ** -0.5),
                                 (a.peer_id, wire.decode(body_a)[1].astype(np.float64) - w1_stored, 1.0)])
        np.testing.assert_allclose(relay.session.weights, w2, rtol=1e-5, atol=1e-6)
        assert status["history"][1]["staleness"] == [1, 0] and status["history"][1]["started_from"] == [0, 1]
        work_until_done(client, [a, b, c])
        assert session_status(client)["done"]
    relay.open()
    arrivals = recorded_arrivals(relay.store)
    assert sorted(x.entry for x in arrivals) == list(range(len(relay.session.plan.schedule)))  # each unit once
    fresh = Session.create(package, relay.session.config)
    replayed = replay(fresh, arrivals, exponent=0.5, validate_every=1)
    np.testing.assert_array_equal(replayed.weights, relay.session.weights)  # the recorded arrivals, bit for bit


def test_results_join_the_next_merges_sum_as_they_arrive_and_a_far_one_is_clipped_to_the_replays_bits(
        package: Package, tmp_path: Path) -> None:
    """The next merge's sum takes each result when it arrives (its part computed in a reader thread), so the merge
    after the K-th adds nothing; centered clipping (the default) reads a far result again by its place in the merge;
    the merged weights are the replay's of the recorded arrivals, bit for bit. (Host replays off: they would ban the
    far result, a lie, and hold each peer's first result out of the sum until its verdict: the next test.)"""
    relay = make_relay(package, tmp_path / "s", k=3, passes=1, config={"mode": "async"}, ban_addresses=False,
                       verify=False)
    with serving(relay) as client:
        a, b, c = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        jobs = {p.peer_id: p.assignment() for p in (a, b, c)}
        for peer in (a, b):
            assert peer.train_and_upload(jobs[peer.peer_id]).status_code == 200
        summed, opened = relay.mode.sums.summed(), relay.mode.sums.open
        assert opened is not None and opened.merge == 0 and len(summed) == 2 and not relay.session.round
        assert sorted(opened.stream.counts) == sorted(summed)  # (keyed by arrival until the merge)
        base, codec = relay.session.weights, relay.session.config.result_codec
        job = jobs[c.peer_id]
        header, trained = result_weights(c.train(job), base, codec)
        far = (base + 2.2 * (trained - base)).astype(np.float32)  # past the radius (2 x median), inside 3 x median
        answer = c.upload(0, job["slot"], as_upload(far, header, base, codec, job["unit_seed"]))
        assert answer.status_code == 200, answer.text
        status = wait_until_version(client, 1)
        assert status["history"][0]["outliers"] == [job["unit_index"]]  # clipped
        assert relay.mode.sums.open is not None and relay.mode.sums.open.merge == 1 and not relay.mode.sums.summed()
        work_until_done(client, [a, b, c])
    relay.open()
    fresh = Session.create(package, relay.session.config)
    replayed = replay(fresh, recorded_arrivals(relay.store), exponent=relay.session.config.staleness_exponent,
                      validate_every=relay.session.config.validate_every)
    np.testing.assert_array_equal(replayed.weights, relay.session.weights)
    with sqlite3.connect(relay.store.location) as db:  # (each digest computed as the result was read)
        audited = db.execute("SELECT a.sha256, m.message FROM arrivals a JOIN arrival_messages m ON m.seq = a.seq"
                             ).fetchall()
    assert audited and all(digest == hashlib.sha256(message).hexdigest() for digest, message in audited)


def test_new_units_wait_while_two_merges_of_results_wait_and_a_held_unit_is_handed_again(package: Package,
                                                                                         tmp_path: Path) -> None:
    """A relay that takes results faster than it merges them stops handing out new units at 2 K waiting results:
    a peer asking then is told to wait and why (as is the page), one holding a unit gets it again, and units go out
    again once a merge has taken K. (Driven without an event loop, so no merge runs unless asked.)"""
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, config=ASYNC, ban_addresses=False)
    holder, newcomer, late = (relay.join("127.0.0.1", agent=f"peer {i}")[0] for i in range(3))
    held = relay.next_work(holder)
    assert isinstance(held, Job)

    def arrive(entry: int) -> int:
        return relay.store.add_arrival(entry=entry, unit_index=entry, peer_id=late, version=0, num_examples=1,
                                       metrics={}, message=b"", update=b"")
    seqs = [arrive(entry) for entry in (7, 8, 9)]
    assert isinstance(relay.next_work(newcomer), Job)  # (3 waiting: fewer than 2 K)
    seqs.append(arrive(10))
    answer = relay.next_work(late)
    assert isinstance(answer, Wait) and "4 results wait to be merged" in answer.reason, answer
    again = relay.next_work(holder)
    assert isinstance(again, Job) and (again.slot, again.unit_index) == (held.slot, held.unit_index)  # (its unit)
    assert "4 results wait to be merged" in relay.status()["waiting"]
    relay.store.mark_merged(seqs[:2], 0)  # (what a merge of K does to the buffer)
    assert isinstance(relay.next_work(late), Job)  # 2 waiting: units go out again


def count_of(relay, job: dict) -> int:  # type: ignore[no-untyped-def]
    from server.session.buffered import entry_assignment

    assignment = entry_assignment(relay.session.plan.schedule, relay.session.plan.seed, job["slot"], job["round"])
    return int(relay.session.task.unit_examples(relay.session.work_unit(assignment)))


def wait_until_version(client, version: int, timeout: float = 20.0) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        status = session_status(client)
        if status["round"] >= version and not status["merging"]:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.02)


def status_weights(relay, version: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    return relay.mode.versions[version].astype(np.float64)


def test_a_peer_asking_again_is_handed_the_unit_it_holds_and_a_new_one_once_it_is_back(package: Package,
                                                                                       tmp_path: Path) -> None:
    """The stream remembers which unit each peer holds: asked again it hands the same one (while its lease lasts),
    after the result a new one, and after a refusal (the lease given up) another, the refused unit going to the next
    peer who asks."""
    relay = make_relay(package, tmp_path / "s", k=4, passes=2, config=ASYNC, ban_addresses=False, verify=False)
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        first = a.assignment()
        assert a.assignment()["slot"] == first["slot"]
        other = b.assignment()
        assert other["slot"] != first["slot"] and b.assignment()["slot"] == other["slot"]
        assert a.train_and_upload(first).status_code == 200
        second = a.assignment()
        assert second["slot"] not in (first["slot"], other["slot"]) and a.assignment()["slot"] == second["slot"]
        refused = a.upload(second["round"], second["slot"], b"not a result message")
        assert refused.status_code in (400, 422), refused.text
        third = a.assignment()
        assert third["slot"] not in (first["slot"], other["slot"], second["slot"])
        assert b.train_and_upload(other).status_code == 200
        assert b.assignment()["slot"] == second["slot"]  # (the unit the refusal gave up, to the next peer)


def test_a_result_too_many_versions_behind_is_refused(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=1, passes=2, config={**ASYNC, "max_staleness": 1},
                       ban_addresses=False)
    with serving(relay) as client:
        slow, fast = HttpPeer(client), HttpPeer(client)
        old = slow.assignment()
        old_body = slow.train(old)
        for _ in range(2):  # two merges while the slow peer trains
            assert fast.train_and_upload(fast.assignment()).status_code == 200
            wait_until_version(client, session_status(client)["round"])
        wait_until_version(client, 2)
        refused = slow.upload(old["round"], old["slot"], old_body)
        assert (refused.status_code, refused.json()["error"]) == (409, "too_stale")


@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
@pytest.mark.usefixtures("majority_importable")  # the peers import majority_task as the relay does
def test_sigkill_mid_async_resumes_with_nothing_lost_and_replays_exactly(tmp_path: Path) -> None:
    session_dir, log = tmp_path / "session", tmp_path / "serve.log"
    relayd = Relayd(session_dir, free_port(), log, config=replace(RELAYD_CONFIG, mode="async", aggregate="mean"),
                    options=relayd_options(keep_results=None))  # (the replay of the arrivals reads every message)
    deadline = time.monotonic() + 150
    gate = UploadGate(limit=5)  # two merges and one result in the buffer, then hold the next upload
    peers = [PeerThread(relayd.url, gate, deadline) for _ in range(3)]
    observer = httpx.Client(base_url=relayd.url, timeout=30)
    try:
        relayd.start()
        for peer in peers:
            peer.start()
        gate.wait_for_held(timeout=90)
        # The fifth result can be accepted while the second merge still runs in its thread (the status says
        # version 1, three results buffered): kill only once that merge is done and its checkpoint written.
        before = status_when(observer, lambda s: s["round"] >= 2 and not s["merging"], deadline)
        assert before["mode"] == "async" and before["round"] == 2 and before["round_progress"]["done"] == 1, before
        relayd.kill()
        assert retrying_fails(observer)
        relayd.start()
        after = retrying(observer, "GET", "/api/session", deadline).json()
        assert after["round"] == 2 and after["round_progress"]["done"] == 1, after  # the buffered result stayed
        gate.open()
        for peer in peers:
            peer.join(timeout=max(1.0, deadline - time.monotonic()))
        for peer in peers:
            assert peer.error is None, f"{peer.error!r}\n{log.read_text()}"
        final_status = retrying(observer, "GET", "/api/session", deadline).json()
        model = observer.get("/api/admin/export/model", headers={"Authorization": f"Bearer {ADMIN}"})
        assert model.status_code == 200, model.text
        final = exported_weights(model.content)
    finally:
        gate.open()
        observer.close()
        relayd.stop()
    assert final_status["done"] and final_status["round"] == final_status["num_rounds"]
    package = Package.load(session_dir / "package")
    config = SessionConfig.from_json(checkpoint.read_session_config(session_dir)["config"])
    store = open_store(session_dir / "relay.sqlite3")
    try:
        arrivals = recorded_arrivals(store)
    finally:
        store.close()
    assert sorted(a.entry for a in arrivals) == list(range(len(package_schedule(package, config))))  # none lost
    replayed = replay(Session.create(package, config), arrivals, exponent=config.staleness_exponent,
                      validate_every=config.validate_every)
    np.testing.assert_array_equal(replayed.weights, final)


def package_schedule(package: Package, config: SessionConfig) -> tuple:
    return Session(package, config).plan.schedule


def test_results_marked_for_a_merge_the_checkpoint_lacks_go_back_to_the_buffer(package: Package,
                                                                               tmp_path: Path) -> None:
    """A merge marks its results in SQLite before it writes its checkpoint; killed in between, the restart puts
    them back in the buffer (nothing lost, nothing merged twice)."""
    from server.relay.state import Relay

    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    with serving(relay) as client:
        peers = [HttpPeer(client), HttpPeer(client)]
        jobs = [peer.assignment() for peer in peers]
        bodies = [peer.train(job) for peer, job in zip(peers, jobs, strict=True)]
        relay.mode.accept(peers[0].peer_id, 0, jobs[0]["slot"], bodies[0])  # in SQLite, no merge yet
    relay.open()
    seqs = [row[0] for row in relay.store.buffered()]
    relay.store.mark_merged(seqs, 0)  # the merge's first step ... and then the process died
    relay.store.close()
    restarted = Relay(session=Session.restore(tmp_path / "s", package), package=package,
                      store=open_store(tmp_path / "s" / "relay.sqlite3"), options=relay.options)
    try:
        assert restarted.session.round == 0 and [row[0] for row in restarted.store.buffered()] == seqs
        assert restarted.store.counters()["arrivals_returned_to_buffer_on_start"] == 1
    finally:
        restarted.close()


def test_validation_every_few_merges(package: Package) -> None:
    from server.session.buffered import validates

    session = Session.create(package, SessionConfig(participants=2, passes=1, mode="async", validate_every=2))
    assert [validates(m, 2, session.num_rounds) for m in range(session.num_rounds)] == [False, True, True]
    schedule = session.plan.schedule
    for merge in range(session.num_rounds):
        units = [u for _, u in schedule[2 * merge: 2 * merge + 2]]
        results = [(u, package.task.train_unit(session.weights, package.task.work_unit(package.data, u, 0)))
                   for u in units]
        session.complete_buffer(results, validate=validates(merge, 2, session.num_rounds))
    series = session.metric_series()
    assert series[1] is None and series[2] is not None and series[3] is not None and session.done
    assert [entry["version"] for entry in session.history] == [1, 2, 3]


def test_an_update_message_is_kept_alone_and_merges_the_update_it_carries_across_a_restart(package: Package,
                                                                                           tmp_path: Path) -> None:
    """int8 results: the buffer keeps the message only (a crowd's buffer wrote a 2.3 MB float32 update beside each
    585 KB message); the merge takes the update the message carries, after a restart too (no old weights needed)."""
    from server.relay.state import Relay

    config = {**ASYNC, "codec": "int8"}
    relay = make_relay(package, tmp_path / "s", k=3, passes=1, config=config, ban_addresses=False)
    with serving(relay) as client:
        peers = [HttpPeer(client) for _ in range(3)]
        jobs = [peer.assignment() for peer in peers[:2]]
        bodies = [peer.train(job) for peer, job in zip(peers, jobs, strict=False)]
        for peer, job, body in zip(peers, jobs, bodies, strict=False):
            assert peer.upload(0, job["slot"], body).status_code == 200
    w0 = relay.session.weights.astype(np.float64)
    relay.open()
    rows = relay.store.buffered()
    assert [row[6] for row in rows] == [b"", b""] and [row[7] for row in rows] == bodies and wire.is_update(bodies[0])
    relay.store.close()
    restarted = Relay(session=Session.restore(tmp_path / "s", package), package=package,
                      store=open_store(tmp_path / "s" / "relay.sqlite3"), options=relay.options)
    with serving(restarted) as client:
        peers[2].http = client
        jobs.append(peers[2].assignment())
        bodies.append(peers[2].train(jobs[2]))
        assert peers[2].upload(0, jobs[2]["slot"], bodies[2]).status_code == 200
        wait_until_version(client, 1)
    codec = restarted.session.config.result_codec
    carried = [wire.carried_update(body, codec).astype(np.float64) for body in bodies]
    counts = [count_of(restarted, job) for job in jobs]
    expected = w0 + sum(n * u for n, u in zip(counts, carried, strict=True)) / sum(counts)
    # (the merged step travels down in int8 too: each weight within one quantization step of the mean)
    np.testing.assert_allclose(restarted.session.weights, expected, rtol=0, atol=np.abs(expected - w0).max() / 127)
    for body, update in zip(bodies, carried, strict=True):  # (the update each message stands for, from its base)
        np.testing.assert_allclose(wire.result_weights(body, w0.astype(np.float32), codec=codec)[1] - w0, update,
                                   atol=1e-6)


def test_a_job_handed_out_while_a_merge_holds_the_new_weights_names_its_version_s_weights(package: Package,
                                                                                        tmp_path: Path) -> None:
    """Async mode hands out jobs while a merge runs in its worker thread, which holds the merged weights before it
    counts the version (the test holds it there). A job handed out then is of the version still current and names
    that version's weights, and its digest serves them. (Before, it named the merged weights' digest under the old
    version: the peer trained from the next version's weights, and its result, read against the version it named,
    was refused as ``wrong_base``, or with float32 results carried the merge's step once more as its own.)"""
    relay = make_relay(package, tmp_path / "s", k=2, passes=1, config=ASYNC, ban_addresses=False)
    history = relay.session.history = PausedHistory(relay.session.history)
    with serving(relay) as client:
        a, b, late = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        w0 = relay.session.weights.copy()
        for peer in (a, b):
            job = peer.assignment()
            assert peer.train_and_upload(job).status_code == 200  # the second fills the buffer: it merges
        assert history.entered.wait(30), "the buffer never merged"
        try:
            assert relay.session.round == 0 and not np.array_equal(relay.session.weights, w0)  # (held there)
            job = late.assignment()
            fetched = client.get(job["weights_url"], headers=late.headers)
        finally:
            history.go.set()
        assert job["round"] == 0 and job["weights_digest"] == wire.weights_sha256(w0), job
        assert fetched.status_code == 200
        np.testing.assert_array_equal(wire.decode(fetched.content)[1], w0)
        wait_until_version(client, 1)
        assert late.train_and_upload(job).status_code == 200  # trained from version 0's weights, read against them
