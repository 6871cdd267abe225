"""Two ``peertrain serve`` processes serving one asynchronous session at once over one PostgreSQL store, behind nginx
(``deploy/nginx.conf`` with its second relay's line): the second starts while the first holds the session and serves
beside it as a replica. Peers speak to nginx, which spreads their requests over both, and one peer speaks to the
replica alone. The holder is SIGKILLed mid-session; the replica takes the session over and finishes it: every unit
arrived once, and the final weights are the recorded arrivals' replay, bit for bit."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from nginx_proxy import free_port, nginx_in_front
from relay_fixtures import EXAMPLE, recorded_arrivals, replayed_arrivals
from relay_process import UploadGate, relayd_options, shared_relay, wait_for, wind_down

from server.harness.native_peer import NativePeer, PeerHooks, RetryPolicy
from server.harness.relay_process import RelayProcess
from server.session import checkpoint_files as checkpoint
from server.session.config import SessionConfig
from server.session.package import Package
from server.session.session import Session

pytestmark = [pytest.mark.slow]
SESSION_SECONDS = 300  # (a bound on the whole session: peers give up past it)
CONFIG = SessionConfig(participants=2, passes=4, mode="async")  # (the majority example's 4 units: 16, 8 merges)
BEFORE_KILL = 6  # results accepted before uploads wait at the gate and the holder is killed


@pytest.mark.timeout(900)
def test_two_relays_serve_an_async_session_at_once_and_the_replica_finishes_it_when_the_holder_is_killed(
        tmp_path: Path, postgresql_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # the peers import majority_task as the relays do
    session_dir = tmp_path / "session"
    options = relayd_options(forwarded_allow_ips="127.0.0.1", verify=False,
                             keep_results=None)  # (the replay of the arrivals reads every message)
    ports = free_port(), free_port()

    def relay(port: int, name: str) -> RelayProcess:
        return shared_relay(tmp_path, name, port=port, session_dir=session_dir, store=postgresql_url, config=CONFIG,
                            options=options, start_timeout_s=SESSION_SECONDS)

    first, second = relay(ports[0], "first"), relay(ports[1], "second")
    gate = UploadGate(limit=BEFORE_KILL)
    retry = RetryPolicy(resend=10_000, restarts=100)  # (the kill's gap: nginx's 502s, a refused connection)
    hooks = PeerHooks(send_result=lambda job, send: gate.upload(send))
    peers: list[NativePeer] = []
    deadline = time.monotonic() + SESSION_SECONDS
    replica_url = f"http://127.0.0.1:{ports[1]}"
    try:
        first.start()
        second.start()  # (listening at once: it serves beside the first)
        assert "serves it beside that one as a replica" in second.logs, second.logs[-2000:]
        with nginx_in_front(ports[0], tmp_path / "nginx", second_port=ports[1]) as (url, ca):
            trusted = ssl.create_default_context(cafile=str(ca.authority))
            direct = httpx.Client(base_url=replica_url, timeout=30)

            def replica_status() -> dict[str, Any]:
                return dict(direct.get("/api/session").json())

            assert replica_status()["replica"] is True
            alone = NativePeer(replica_url, timeout_s=SESSION_SECONDS, retry=retry, hooks=hooks)  # (the replica's)
            peers = [alone] + [NativePeer(url, verify=trusted, timeout_s=SESSION_SECONDS, retry=retry, hooks=hooks)
                               for _ in range(5)]
            for peer in peers:
                peer.start()
            gate.wait_for_held(timeout=SESSION_SECONDS)  # BEFORE_KILL results in, a trained one waiting: mid-session
            taken_by_replica_alone = len(alone.log.accepted)
            first.kill()
            gate.open()
            wait_for("the replica to take the session over", lambda: replica_status()["replica"] is False, deadline)
            for peer in peers:
                peer.join(max(1.0, deadline - time.monotonic()))
            final = replica_status()
            direct.close()
    finally:
        wind_down(gate, peers, first, second)
    assert "this relay holds the session now" in second.logs, second.logs[-3000:]
    assert [peer.ended for peer in peers] == ["done"] * len(peers), [(p.ended, p.error) for p in peers]
    assert taken_by_replica_alone >= 1  # (the replica took results while the holder merged them)
    assert final["done"] and final["counters"]["takeovers"] == 1, final["counters"]
    arrivals = recorded_arrivals(postgresql_url)
    assert sorted(x.entry for x in arrivals) == list(range(16))  # every unit arrived once: none lost, none twice
    package = Package.load(session_dir / "package")
    config = Session.restore(session_dir, package, read_only=True).config
    final_weights = checkpoint.read_latest(session_dir).weights
    assert np.array_equal(final_weights, replayed_arrivals(package, config, arrivals))  # bit for bit
