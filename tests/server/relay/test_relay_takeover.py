"""Two ``peertrain serve`` processes over one PostgreSQL store behind nginx (``deploy/nginx.conf`` with its second
relay's line): the first serves the session, the second waits, not listening, for the session's hold. The first is
SIGKILLed mid-round and the second takes the session over from its checkpoint and the store. Twenty native peers and
one attacker speak to nginx only: the session finishes, no unit is lost, the attacker stays banned, and the final
weights are an uninterrupted one-process run's, bit for bit."""

from __future__ import annotations

import ssl
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from nginx_proxy import free_port, nginx_in_front
from relay_fixtures import EXAMPLE, reference_run, replay
from relay_process import ADMIN, UploadGate, relayd_options, shared_relay, wait_for, wind_down

from runtime import wire
from server.harness.native_peer import Job, NativePeer, PeerHooks, RetryPolicy
from server.harness.relay_process import RelayProcess
from server.relay.store import open_store
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
def test_the_second_relay_takes_the_session_over_when_the_first_is_killed_mid_round(
        tmp_path: Path, postgresql_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # the peers import majority_task as the relays do
    session_dir = tmp_path / "session"
    options = relayd_options(forwarded_allow_ips="127.0.0.1", replay_engine="native", verify_fraction=0.0,
                             replay_wait="all")  # (every peer's first result replayed before its round merges)
    ports = free_port(), free_port()

    def relay(port: int, name: str) -> RelayProcess:
        return shared_relay(tmp_path, name, port=port, session_dir=session_dir, store=postgresql_url, config=CONFIG,
                            options=options, start_timeout_s=SESSION_SECONDS)

    first, second = relay(ports[0], "first"), relay(ports[1], "second")
    took_over: list[float] = []

    def take_over() -> None:
        try:
            took_over.append(second.start())
        except Exception as error:  # (said by the assertion below, with its log)
            print(f"the second relay did not start: {error}")

    waiter = threading.Thread(target=take_over, daemon=True)
    gate = UploadGate(limit=3)  # round 0's two results and round 1's first, then uploads wait
    retry = RetryPolicy(resend=10_000, restarts=100)  # (the takeover's gap: refused connections, nginx's 502s)
    peers: list[NativePeer] = []
    deadline = time.monotonic() + SESSION_SECONDS
    try:
        first.start()
        waiter.start()
        wait_for("the second relay to wait", lambda: "this one waits" in second.logs, deadline)
        with nginx_in_front(ports[0], tmp_path / "nginx", standby_port=ports[1]) as (url, ca):
            trusted = ssl.create_default_context(cafile=str(ca.authority))
            watcher = httpx.Client(base_url=url, verify=trusted, timeout=30)
            def status() -> dict:
                return dict(watcher.get("/api/session").json())

            attacker = NativePeer(url, verify=trusted, timeout_s=SESSION_SECONDS, retry=retry,
                                  hooks=PeerHooks(upload=flipped))
            peers.append(attacker)
            attacker.start()  # alone first: its first result is replayed, fails, and bans it
            attacker.join(SESSION_SECONDS)
            assert attacker.ended == "banned" and status()["counters"]["peers_banned"] == 1
            honest = [NativePeer(url, verify=trusted, timeout_s=SESSION_SECONDS, retry=retry,
                                 hooks=PeerHooks(send_result=lambda job, send: gate.upload(send))) for _ in range(20)]
            peers += honest
            for peer in honest:
                peer.start()
            gate.wait_for_held(timeout=SESSION_SECONDS)  # another peer trained a unit of round 1: mid-round
            before = status()
            assert before["round"] == 1 and before["round_progress"]["done"] == 1, before["round_progress"]
            first.kill()
            waiter.join(timeout=max(1.0, deadline - time.monotonic()))
            assert took_over, f"the second relay did not take over:\n{second.logs[-3000:]}"
            gate.open()
            for peer in honest:
                peer.join(max(1.0, deadline - time.monotonic()))
            final = status()
            listing = watcher.get("/api/admin/peers", headers={"Authorization": f"Bearer {ADMIN}"}).json()["peers"]
            watcher.close()
    finally:
        wind_down(gate, peers, first, second)
    assert "taking the session over" in second.logs and "resuming session" in second.logs
    assert final["done"] and len(final["history"]) == 4, final.get("waiting")
    assert final["counters"].get("leases_released_on_start", 0) >= 1  # (the held unit's lease, handed out again)
    assert [peer.ended for peer in honest] == ["done"] * 20, [(p.ended, p.error) for p in honest]
    assert [p["peer_id"] for p in listing if p["banned"]] == [attacker.peer_id]
    stored = open_store(postgresql_url)
    try:
        results = stored.all_results()
    finally:
        stored.close()
    assert sorted((r.round, r.slot) for r in results) == [(r, s) for r in range(4) for s in range(2)]  # none lost
    assert attacker.peer_id not in {r.peer_id for r in results}
    package = Package.load(session_dir / "package")
    final_weights = checkpoint.read_latest(session_dir).weights
    assert np.array_equal(final_weights, replay(package, CONFIG, results).weights)  # the arrivals, in one process
    assert np.array_equal(final_weights, reference_run(package, CONFIG))  # and an uninterrupted run
