"""Two ``peertrain serve`` processes serving one synchronous session at once over one PostgreSQL store behind nginx
(``deploy/nginx.conf`` with its second relay's line): the first holds the session, the second serves beside it as a
replica (hands out units; the results it takes are judged by the first), and one peer speaks to the replica alone.
The holder is SIGKILLed mid-round and the replica takes the session over from its checkpoint and the store. Twenty
native peers and one attacker speak to nginx: the session finishes, no unit is lost, the attacker stays banned, and
the final weights are an uninterrupted one-process run's, bit for bit."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from nginx_proxy import free_port, nginx_in_front
from relay_fixtures import EXAMPLE, recorded_results, reference_run, replay
from relay_process import ADMIN, UploadGate, relayd_options, shared_relay, wait_for, wind_down

from runtime import wire
from server.harness.native_peer import Job, NativePeer, PeerHooks, RetryPolicy
from server.harness.relay_process import RelayProcess
from server.session import checkpoint_files as checkpoint
from server.session.config import SessionConfig
from server.session.package import Package

pytestmark = [pytest.mark.slow]
SESSION_SECONDS = 300  # (a bound on the whole session: peers give up past it)
CONFIG = SessionConfig(participants=2, passes=2)  # (the majority example's 4 units: 4 rounds of 2)


def flipped(job: Job, honest: bytes) -> bytes:
    header, vector = wire.decode(honest)  # (the example's results are float32 weights: its default codec)
    return wire.encode((-4 * vector).astype("float32"), header)


@pytest.mark.timeout(900)
def test_two_relays_serve_a_sync_session_and_the_replica_takes_it_over_when_the_holder_is_killed_mid_round(
        tmp_path: Path, postgresql_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # the peers import majority_task as the relays do
    session_dir = tmp_path / "session"
    options = relayd_options(forwarded_allow_ips="127.0.0.1", replay_engine="native", verify_fraction=0.0,
                             replay_wait="all")  # (every peer's first result replayed before its round merges)
    ports = free_port(), free_port()
    replica_url = f"http://127.0.0.1:{ports[1]}"

    def relay(port: int, name: str) -> RelayProcess:
        return shared_relay(tmp_path, name, port=port, session_dir=session_dir, store=postgresql_url, config=CONFIG,
                            options=options, start_timeout_s=SESSION_SECONDS)

    first, second = relay(ports[0], "first"), relay(ports[1], "second")
    gate = UploadGate(limit=3)  # round 0's two results and round 1's first, then uploads wait
    retry = RetryPolicy(resend=10_000, restarts=100)  # (the takeover's gap: refused connections, nginx's 502s)
    peers: list[NativePeer] = []
    deadline = time.monotonic() + SESSION_SECONDS
    try:
        first.start()
        second.start()  # (listening at once: it serves beside the first)
        assert "serves it beside that one as a replica" in second.logs, second.logs[-2000:]
        with nginx_in_front(ports[0], tmp_path / "nginx", second_port=ports[1]) as (url, ca):
            trusted = ssl.create_default_context(cafile=str(ca.authority))
            watcher = httpx.Client(base_url=url, verify=trusted, timeout=30)
            direct = httpx.Client(base_url=replica_url, timeout=30)

            def status() -> dict:  # (the holder's, or the replica's: they read one store and one session)
                return dict(watcher.get("/api/session").json())

            assert direct.get("/api/session").json()["replica"] is True

            attacker = NativePeer(replica_url, timeout_s=SESSION_SECONDS, retry=retry,  # (the replica's: its
                                  hooks=PeerHooks(upload=flipped))  # result is judged, and replayed, by the holder)
            peers.append(attacker)
            attacker.start()  # alone first: its first result is replayed, fails, and bans it
            attacker.join(SESSION_SECONDS)
            assert attacker.ended == "banned" and status()["counters"]["peers_banned"] == 1
            assert status()["counters"]["results_forwarded"] >= 1  # (the attacker's, handed over by the replica)
            hooks = PeerHooks(send_result=lambda job, send: gate.upload(send))
            alone = NativePeer(replica_url, timeout_s=SESSION_SECONDS, retry=retry, hooks=hooks)  # (the replica's)
            honest = [alone] + [NativePeer(url, verify=trusted, timeout_s=SESSION_SECONDS, retry=retry, hooks=hooks)
                                for _ in range(19)]
            peers += honest
            for peer in honest:
                peer.start()
            gate.wait_for_held(timeout=SESSION_SECONDS)  # another peer trained a unit of round 1: mid-round
            with httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}", timeout=30) as holder:  # (what it holds
                before = dict(holder.get("/api/session").json())  # exactly: a replica's view is a moment old)
            assert before["round"] == 1 and before["round_progress"]["done"] == 1, before["round_progress"]
            first.kill()
            gate.open()
            wait_for("the replica to take the session over",
                     lambda: direct.get("/api/session").json()["replica"] is False, deadline)
            for peer in honest:
                peer.join(max(1.0, deadline - time.monotonic()))
            final = status()
            listing = watcher.get("/api/admin/peers", headers={"Authorization": f"Bearer {ADMIN}"}).json()["peers"]
            watcher.close()
            direct.close()
    finally:
        wind_down(gate, peers, first, second)
    assert "this relay holds the session now" in second.logs, second.logs[-3000:]
    assert final["done"] and len(final["history"]) == 4, final.get("waiting")
    assert final["counters"]["takeovers"] == 1, final["counters"]
    assert [peer.ended for peer in honest] == ["done"] * 20, [(p.ended, p.error) for p in honest]
    assert [p["peer_id"] for p in listing if p["banned"]] == [attacker.peer_id]
    results = recorded_results(postgresql_url)
    assert sorted((r.round, r.slot) for r in results) == [(r, s) for r in range(4) for s in range(2)]  # none lost
    assert attacker.peer_id not in {r.peer_id for r in results}
    package = Package.load(session_dir / "package")
    final_weights = checkpoint.read_latest(session_dir).weights
    assert np.array_equal(final_weights, replay(package, CONFIG, results).weights)  # the arrivals, in one process
    assert np.array_equal(final_weights, reference_run(package, CONFIG))  # and an uninterrupted run
