"""The relay through its HTTP API (Starlette's TestClient), with native peers training the majority example.

Every refusal must come with its own 4xx status, a machine-readable code and a message, be counted in
``/api/session``, and leave the global weights exactly as they were.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from relay_fixtures import (
    ADMIN_TOKEN,
    HttpPeer,
    build_small_package,
    make_relay,
    reference_run,
    replay,
    run_round,
    serving,
    session_status,
    sha256,
    wait_for_round,
)
from starlette.testclient import TestClient

from runtime import wire
from server.relay.book import EARLY
from server.relay.state import Relay
from server.relay.store import LAST_SEEN_RESOLUTION
from server.session.export import exported_weights
from server.session.package import Package


def counters(client: httpx.Client) -> Counter[str]:
    return Counter(session_status(client)["counters"])


def refusals(client: httpx.Client) -> dict[str, int]:
    return {name: value for name, value in counters(client).items() if name.startswith("refused.")}


def assert_refused(response: httpx.Response, status: int, code: str, fragment: str) -> None:
    assert response.status_code == status, f"{code}: {response.status_code} {response.text}"
    body = response.json()
    assert body["error"] == code, body
    assert fragment in body["message"], body


# ---------------------------------------------------------------- happy path and replay


def test_two_peers_train_every_round_and_validation_improves(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=2)
    with serving(relay) as client:
        first, second = HttpPeer(client), HttpPeer(client)
        status = session_status(client)
        assert (status["round"], status["num_rounds"], status["peers"]["joined"]) == (0, 4, 2)
        initial = status["initial_metrics"]
        for round_index in range(4):
            status = run_round(client, [first, second])
            assert status["round"] == round_index + 1
            assert [entry["round"] for entry in status["history"]] == list(range(round_index + 1))
            assert status["history"][-1]["participants"] == 2 and not status["history"][-1]["missing"]
        assert status["done"] and first.work()["done"] is True
        losses = [initial["val_loss"]] + [entry["metrics"]["val_loss"] for entry in status["history"]]
        assert losses[-1] < losses[0] - 0.05, losses
        assert status["history"][-1]["metrics"]["accuracy"] > initial["accuracy"]
        assert status["counters"]["results_accepted"] == 8 and not refusals(client)
        _, served = wire.decode(first.weights(), expect_spec=relay.session.spec)
        assert np.array_equal(served, relay.session.weights)
        deadline = time.monotonic() + 10
        while session_status(client)["samples_round"] != 4 and time.monotonic() < deadline:
            time.sleep(0.02)  # the page's samples follow the merge, off the round's critical path
        samples = session_status(client)["samples"]
        assert len(samples) == 4 and all(isinstance(s["ok"], bool) and " -> " in s["text"] for s in samples)


def test_replaying_recorded_results_reproduces_the_weights_bit_for_bit(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=2)
    with serving(relay) as client:
        peers = [HttpPeer(client), HttpPeer(client)]
        for _ in range(3):
            run_round(client, peers)
        recorded = relay.store.all_results()
    assert [(r.round, r.slot) for r in recorded] == [(r, s) for r in range(3) for s in range(2)]
    replayed = replay(package, relay.session.config, recorded)
    assert replayed.round == relay.session.round == 3
    assert np.array_equal(replayed.weights, relay.session.weights)
    assert [e["metrics"] for e in replayed.history] == [e["metrics"] for e in relay.session.history]
    # ... and peers over HTTP computed what in-process training computes: native training is deterministic.
    capped = dataclasses.replace(relay.session.config, max_rounds=3)
    assert np.array_equal(reference_run(package, capped), relay.session.weights)


def test_a_round_summed_as_its_results_arrive_keeps_few_weights_and_merges_the_simulators_bits(tmp_path: Path) -> None:
    """Twelve results a round uploaded in a shuffled order: the relay adds each to the round's sum as it arrives
    and keeps the decoded weights of the first EARLY only; the merge gives what merging the recorded results at once
    (slot order, the simulator's way) gives, to the bit, with centered clipping (the default) and with the mean."""
    package = build_small_package(tmp_path / "package", chunks=24, examples=24 * 32)
    for aggregate in ("centered_clipping", "mean"):
        relay = make_relay(package, tmp_path / aggregate, k=12, passes=1, config={"aggregate": aggregate})
        with serving(relay) as client:
            peers = [HttpPeer(client) for _ in range(12)]
            rng = np.random.default_rng(5)
            for round_index in range(2):
                jobs = [(peer, peer.assignment()) for peer in peers]
                bodies = [(peer, job, peer.train(job)) for peer, job in jobs]
                for number, index in enumerate(rng.permutation(12)):
                    peer, job, body = bodies[index]
                    if number == 11:  # (before the last: the round's sum holds 11, its weights only the first 8)
                        stream = relay.book.stream(round_index)
                        assert stream is not None and len(stream.counts) == 11
                        assert len(relay.book.kept_round(round_index)) == EARLY
                    assert peer.upload(job["round"], job["slot"], body).status_code == 200
                wait_for_round(client, round_index + 1)
            recorded = relay.store.all_results()
        replayed = replay(package, relay.session.config, recorded)
        assert replayed.round == relay.session.round == 2
        assert np.array_equal(replayed.weights, relay.session.weights), aggregate
        assert [e["outliers"] for e in replayed.history] == [e["outliers"] for e in relay.session.history]


# ---------------------------------------------------------------- bad results


@dataclasses.dataclass
class Leased:
    """A relay in round 0 where peer ``a`` holds slot ``job['slot']`` and peer ``b`` the other one."""

    client: TestClient
    relay: Relay
    a: HttpPeer
    b: HttpPeer
    job: dict[str, Any]
    good: bytes  # a's honest result
    header: wire.WireHeader
    vector: np.ndarray

    def message(self, vector: np.ndarray | None = None, **changes: Any) -> bytes:
        header = dataclasses.replace(self.header, **changes)
        return wire.encode(self.vector if vector is None else vector, header, check_finite=False)

    def upload(self, body: bytes, *, slot: int | None = None, query: str | None = None,
               headers: dict[str, str] | None = None) -> httpx.Response:
        query = query or f"round={self.job['round']}&slot={self.job['slot'] if slot is None else slot}"
        return self.client.post(f"/api/result?{query}", content=body,
                                headers=self.a.headers if headers is None else headers)


@pytest.fixture()
def leased(package: Package, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leased]:
    """A fresh relay per case: a refused result frees its slot (and bars its peer from it), so a case
    cannot reuse the previous one's lease."""
    relay = make_relay(package, tmp_path_factory.mktemp("bad-input"), k=2, passes=1, max_update_norm=50.0)
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        job = a.assignment()
        b.assignment()
        good = a.train(job)
        header, vector = wire.decode(good)
        yield Leased(client, relay, a, b, job, good, header, vector)


def header_surgery(message: bytes, old: bytes, new: bytes) -> bytes:
    """Replace ``old`` by ``new`` (same length, so the padding stays right) inside the JSON header, and recompute
    the checksum (``runtime.wire``: magic, CRC-32, header length, header from offset 12), so that the checks
    behind it are reached."""
    assert len(old) == len(new)
    header_end = 12 + int.from_bytes(message[8:12], "little")
    assert message[12:header_end].count(old) == 1
    return wire.reseal(message[:12] + message[12:header_end].replace(old, new) + message[header_end:])


def with_value(vector: np.ndarray, index: int, value: float) -> np.ndarray:
    changed = vector.copy()
    changed[index] = value
    return changed


def chunked(body: bytes) -> Iterator[bytes]:
    """A body without Content-Length (chunked transfer), so only the streaming check can stop it."""
    for start in range(0, len(body), 1 << 20):
        yield body[start:start + (1 << 20)]


def oversize(s: Leased) -> bytes:
    return s.good + b"\0" * (wire.MAX_HEADER_BYTES + 1)


BAD_RESULTS: dict[str, tuple[int, str, str, Callable[[Leased], httpx.Response]]] = {
    "nan": (422, "non_finite", "not finite", lambda s: s.upload(s.message(with_value(s.vector, 3, np.nan)))),
    "plus_inf": (422, "non_finite", "not finite", lambda s: s.upload(s.message(with_value(s.vector, 0, np.inf)))),
    "minus_inf": (422, "non_finite", "not finite",
                  lambda s: s.upload(s.message(with_value(s.vector, -1, -np.inf)))),
    "payload_cut": (400, "checksum", "damaged or cut short", lambda s: s.upload(s.good[:-4])),
    "payload_grown": (400, "checksum", "damaged or cut short", lambda s: s.upload(s.good + b"\0\0\0\0")),
    "payload_flipped": (400, "checksum", "damaged or cut short",
                        lambda s: s.upload(s.good[:-5] + bytes([s.good[-5] ^ 4]) + s.good[-4:])),
    "payload_short": (400, "length_mismatch", "expected", lambda s: s.upload(wire.reseal(s.good[:-4]))),
    "payload_long": (400, "length_mismatch", "expected", lambda s: s.upload(wire.reseal(s.good + b"\0\0\0\0"))),
    "truncated": (400, "truncated", "preamble", lambda s: s.upload(s.good[:6])),
    "empty": (400, "truncated", "preamble", lambda s: s.upload(b"")),
    "bad_magic": (400, "bad_magic", "magic", lambda s: s.upload(b"PTA2" + s.good[4:])),
    "outdated_format": (400, "outdated_format", "runtime is out of date",  # version 1: no checksum, header at 8
                        lambda s: s.upload(b"PTW1" + s.good[8:])),
    "header_length": (400, "header_length", "runs past the end", lambda s: s.upload(
        wire.reseal(s.good[:8] + (len(s.good) * 2).to_bytes(4, "little") + s.good[12:]))),
    "dtype_header": (400, "dtype_mismatch", "float32",
                     lambda s: s.upload(header_surgery(s.good, b'"float32"', b'"float64"'))),
    "malformed_header": (400, "malformed_header", "not valid JSON",
                         lambda s: s.upload(header_surgery(s.good, b'"round":', b'"round";'))),
    "header_round_missing": (400, "malformed_header", "'round'",
                             lambda s: s.upload(header_surgery(s.good, b'"round":', b'"ruond":'))),
    "nan_in_header": (400, "malformed_header", "NaN",
                      lambda s: s.upload(header_surgery(s.good, b'"num_examples":256', b'"num_examples":NaN'))),
    "wrong_fingerprint": (409, "fingerprint_mismatch", "this relay runs",
                          lambda s: s.upload(s.message(fingerprint="0" * 16))),
    "header_round_stale": (409, "stale_round", "current round", lambda s: s.upload(s.message(round=1))),
    "query_round_stale": (409, "stale_round", "not the current round",
                          lambda s: s.upload(s.message(round=1), query=f"round=1&slot={s.job['slot']}")),
    "wrong_spec": (422, "shape_mismatch", "spec",  # same size, entries renamed and reshaped
                   lambda s: s.upload(header_surgery(s.good, b'"layers.0.bias","layers.1.weight"',
                                                     b'"layers.0.bias","layers.1.wEIGHT"'))),
    "wrong_shape": (422, "shape_mismatch", "spec",
                    lambda s: s.upload(header_surgery(s.good, b"[[32,8],[32]", b"[[8,32],[32]"))),
    "no_examples": (422, "num_examples", "positive", lambda s: s.upload(s.message(num_examples=0))),
    "update_norm": (422, "update_norm", "exceeds the bound", lambda s: s.upload(s.message(s.vector + 10.0))),
    "oversize": (413, "too_large", "exceeds the limit", lambda s: s.upload(oversize(s))),
    "oversize_chunked": (413, "too_large", "exceeds the limit", lambda s: s.client.post(
        f"/api/result?round=0&slot={s.job['slot']}", content=chunked(oversize(s)), headers=s.a.headers)),
    "missing_token": (401, "unauthorized", "token", lambda s: s.upload(s.good, headers={})),
    "wrong_token": (401, "unauthorized", "token",
                    lambda s: s.upload(s.good, headers={"Authorization": f"Bearer {s.a.peer_id}:not-the-token"})),
    "other_peers_token": (401, "unauthorized", "token",
                          lambda s: s.upload(s.good, headers={"Authorization": f"Bearer {s.a.peer_id}:{s.b.token}"})),
    "unknown_peer": (401, "unauthorized", "token",
                     lambda s: s.upload(s.good, headers={"Authorization": "Bearer p-nobody:whatever"})),
    "query_missing_slot": (400, "bad_query", "round= and slot=", lambda s: s.upload(s.good, query="round=0")),
    "query_not_integer": (400, "bad_query", "round= and slot=", lambda s: s.upload(s.good, query="round=0&slot=x")),
    "unknown_slot": (404, "unknown_slot", "no slot 7", lambda s: s.upload(s.good, slot=7)),
    "slot_of_another_peer": (403, "not_leased", "not leased to this peer",
                             lambda s: s.upload(s.good, slot=1 - s.job["slot"])),
}


@pytest.mark.parametrize("case", sorted(BAD_RESULTS))
def test_bad_result_is_refused_counted_and_changes_nothing(leased: Leased, case: str) -> None:
    status, code, fragment, send = BAD_RESULTS[case]
    weights_before = sha256(leased.a.weights())
    vector_before = sha256(leased.relay.session.weights.tobytes())
    counted_before = counters(leased.client)[f"refused.{code}"]
    assert_refused(send(leased), status, code, fragment)
    assert counters(leased.client)[f"refused.{code}"] == counted_before + 1
    assert sha256(leased.a.weights()) == weights_before
    assert sha256(leased.relay.session.weights.tobytes()) == vector_before
    assert leased.relay.store.results(0) == {} and session_status(leased.client)["round"] == 0


def test_refusals_by_lease_and_order(package: Package, tmp_path: Path) -> None:
    """Never-leased and someone else's slot, duplicate, stale round after the merge, unleased chunks."""
    relay = make_relay(package, tmp_path / "session", k=2, passes=1)
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        job_a = a.assignment()
        result_a = a.train(job_a)
        other = 1 - job_a["slot"]
        checksum = sha256(a.weights())
        assert_refused(a.upload(0, other, result_a), 403, "not_leased", "not leased to this peer")  # never leased
        job_b = b.assignment()
        assert job_b["slot"] == other
        assert_refused(a.upload(0, other, result_a), 403, "not_leased", "not leased to this peer")  # b's slot
        assert_refused(client.get(f"/api/unit/{job_b['unit_index']}", headers=a.headers), 403, "not_leased", "unit")
        assert_refused(client.get("/api/weights"), 401, "unauthorized", "token")
        assert b.train_and_upload(job_b).status_code == 200
        assert_refused(b.upload(0, other, b.train(job_b)), 409, "duplicate", "already has a result")
        assert sha256(a.weights()) == checksum and relay.session.round == 0
        assert a.upload(0, job_a["slot"], result_a).status_code == 200
        wait_for_round(client, 1)
        merged = sha256(a.weights())
        assert merged != checksum
        assert_refused(a.upload(0, job_a["slot"], result_a), 409, "stale_round", "not the current round")
        assert sha256(a.weights()) == merged
        assert refusals(client) == {"refused.not_leased": 3, "refused.unauthorized": 1, "refused.duplicate": 1,
                                    "refused.stale_round": 1}
        assert len(relay.store.all_results()) == 2


# ---------------------------------------------------------------- leases


def test_expired_lease_goes_to_another_peer_and_each_unit_is_trained_once(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, lease_seconds=0.5)
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        job_a = a.assignment()  # a 0.5 s lease; a trains, then goes silent
        relay.options.lease_seconds = 60.0  # b's leases outlast any slowness of this machine
        late_result = a.train(job_a)
        assert b.train_and_upload().status_code == 200
        asked, answer = time.time(), b.work()
        if asked < job_a["lease_deadline"]:
            assert "wait" in answer, answer  # a's lease still holds
        time.sleep(max(0.0, job_a["lease_deadline"] - time.time()) + 0.05)
        job_b = b.assignment()
        assert {k: job_b[k] for k in ("round", "slot", "unit_index", "unit_seed")} == \
               {k: job_a[k] for k in ("round", "slot", "unit_index", "unit_seed")}
        assert_refused(a.upload(0, job_a["slot"], late_result), 403, "not_leased", "not leased to this peer")
        result_b = b.train(job_b)
        assert b.upload(0, job_b["slot"], result_b).status_code == 200
        wait_for_round(client, 1)
        # The same assignment trains the same way wherever it runs.
        assert np.array_equal(wire.decode(late_result)[1], wire.decode(result_b)[1])

        # Round 1: a's short lease runs out and nobody takes the slot: its upload is late, then it asks again.
        relay.options.lease_seconds = 0.3
        job_a = a.assignment()
        relay.options.lease_seconds = 60.0
        result_a = a.train(job_a)
        assert b.train_and_upload().status_code == 200
        time.sleep(max(0.0, job_a["lease_deadline"] - time.time()) + 0.05)
        assert_refused(a.upload(1, job_a["slot"], result_a), 409, "late", "expired")
        again = a.assignment()
        assert again["slot"] == job_a["slot"] and again["lease_deadline"] > job_a["lease_deadline"]
        assert a.upload(1, again["slot"], result_a).status_code == 200
        status = wait_for_round(client, 2)
        assert status["done"]
        assert status["counters"]["leases_expired"] == 2
        results = relay.store.all_results()
    assert Counter((r.round, r.slot) for r in results) == Counter({(0, 0): 1, (0, 1): 1, (1, 0): 1, (1, 1): 1})
    assert sorted(r.unit_index for r in results) == list(range(package.data.num_units))  # one pass, each unit once
    assert {(r.round, r.slot): r.peer_id for r in results}[(0, job_b["slot"])] == b.peer_id


# ---------------------------------------------------------------- admin and join code


ADMIN_CALLS = [("POST", "/api/admin/pause"), ("POST", "/api/admin/resume"), ("POST", "/api/admin/stop"),
               ("GET", "/api/admin/export/model"), ("GET", "/api/admin/export/history")]


def test_admin_actions_need_the_admin_token(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=1)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with serving(relay) as client:
        a, b = HttpPeer(client), HttpPeer(client)
        for method, path in ADMIN_CALLS:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
                            a.headers):
                assert_refused(client.request(method, path, headers=headers), 401, "unauthorized", "admin token")
        assert refusals(client) == {"refused.unauthorized": 4 * len(ADMIN_CALLS)}
        assert session_status(client)["paused"] is False and not relay.session.done

        assert client.post("/api/admin/pause", headers=admin).json()["paused"] is True
        assert a.work()["reason"] == "paused" and session_status(client)["paused"] is True
        assert client.post("/api/admin/resume", headers=admin).json()["paused"] is False
        run_round(client, [a, b])

        model = client.get("/api/admin/export/model", headers=admin)
        assert model.status_code == 200
        assert np.array_equal(exported_weights(model.content), relay.session.weights)
        history = client.get("/api/admin/export/history", headers=admin).text.splitlines()
        assert [json.loads(line)["round"] for line in history] == list(range(relay.session.round)) == [0]
        assert_refused(client.get("/api/admin/export/nothing", headers=admin), 404, "unknown_export", "nothing")

        stopped = client.post("/api/admin/stop", headers=admin).json()
        assert stopped["stopped"] == "stopped by the admin"
        assert a.work() == {"done": True, "reason": "stopped by the admin"}
        assert session_status(client)["done"] is True


def test_join_code_is_required_when_set(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", join_code="open-sesame")
    with serving(relay) as client:
        assert_refused(client.post("/api/join", json={}), 403, "join_code", "join code")
        assert_refused(client.post("/api/join"), 403, "join_code", "join code")
        assert_refused(client.post("/api/join", json={"join_code": "open-sesamE"}), 403, "join_code", "join code")
        assert_refused(client.post("/api/join", content=b"{not json"), 400, "bad_json", "JSON")
        assert_refused(client.post("/api/join", json=["open-sesame"]), 400, "bad_json", "JSON object")
        peer = HttpPeer(client, join_code="open-sesame")
        assert "slot" in peer.work()  # admitted: a lone peer is handed a unit (no start gate by default)
        assert refusals(client) == {"refused.join_code": 3, "refused.bad_json": 2}
        assert session_status(client)["peers"]["joined"] == 1


def test_work_query_needs_a_peer(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session")
    with serving(relay) as client:
        assert_refused(client.post("/api/work"), 401, "unauthorized", "join first")
        assert_refused(client.get("/api/unit/0", headers={"Authorization": "Bearer :"}), 401, "unauthorized", "token")


# ---------------------------------------------------------------- held work requests (?hold=S)


def test_held_work_request_is_answered_when_the_round_opens(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=2)
    with serving(relay) as client:
        first, second = HttpPeer(client), HttpPeer(client)
        jobs = [first.assignment(), second.assignment()]
        assert first.train_and_upload(jobs[0]).status_code == 200
        started = time.monotonic()
        answer = first.work(hold=0.3)  # nothing changes: held for its 0.3 s, then told to ask again at once
        assert time.monotonic() - started >= 0.3
        assert answer["wait"] == 0 and "other peers' units" in answer["reason"]
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(first.work, 15)
            time.sleep(0.3)
            assert not held.done()
            uploaded = time.monotonic()
            assert second.train_and_upload(jobs[1]).status_code == 200
            job = held.result(timeout=20)
        assert time.monotonic() - uploaded < 10  # answered by the merge, not by the end of its hold
        assert job["round"] == 1 and "slot" in job
        assert session_status(client)["history"][-1]["participants"] == 2


def test_held_work_request_wakes_when_a_peer_joins(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=2, min_peers=2)  # (the host's start gate)
    with serving(relay) as client:
        alone = HttpPeer(client)
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(alone.work, 15)
            time.sleep(0.3)
            assert not held.done()
            joined = time.monotonic()
            HttpPeer(client)
            job = held.result(timeout=20)
        assert time.monotonic() - joined < 10 and job["round"] == 0 and "slot" in job


def test_hold_is_capped_by_the_peer_timeout_and_checked(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, peer_timeout=0.6, min_peers=2)
    with serving(relay) as client:
        alone = HttpPeer(client)
        started = time.monotonic()
        answer = alone.work(hold=30)  # held at most half the peer timeout, so the peer never looks gone
        assert 0.3 <= time.monotonic() - started < 5 and answer["wait"] == 0
        for bad in ("soon", "-1", "inf", "nan"):
            assert_refused(client.post(f"/api/work?hold={bad}", headers=alone.headers), 400, "bad_query", "hold=")
        # last_seen is written at most once per LAST_SEEN_RESOLUTION: past it, a request counts the peer as seen
        # (on a loaded machine the requests above can take longer than the 0.6 s peer timeout)
        time.sleep(LAST_SEEN_RESOLUTION)
        alone.work()
        assert session_status(client)["peers"]["connected"] == 1


def test_head_of_the_event_stream_answers_at_once(package: Package, tmp_path: Path) -> None:
    """HEAD /api/events gets the stream's headers and no body (it used to hold the connection open forever)."""
    import threading

    relay = make_relay(package, tmp_path / "session", k=2, passes=1)
    with serving(relay) as client:
        answers: list[int] = []
        asking = threading.Thread(target=lambda: answers.append(client.head("/api/events").status_code),
                                  daemon=True)
        asking.start()
        asking.join(timeout=5)
        assert answers == [200]
        response = client.head("/api/events")
        assert response.headers["content-type"].startswith("text/event-stream") and response.content == b""
