"""Admission: joins per client address (a token bucket, 429 with Retry-After), live peers per address, the
client address through a trusted proxy header."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from relay_fixtures import ADMIN_TOKEN, make_relay, serving, session_status

from server.relay.admission import JoinLimiter, TokenBucket
from server.relay.refusal import Refusal
from server.session.package import Package


def test_the_token_bucket_by_hand() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, tokens=3.0, updated=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)  # one token every 0.5 s
    assert bucket.take(0.25) == pytest.approx(0.25)
    assert bucket.take(0.5) == 0.0


def test_the_limiter_refuses_with_retry_after_and_keeps_addresses_apart() -> None:
    limiter = JoinLimiter(rate=1.0, burst=2)
    limiter.admit("10.0.0.1", now=0.0)
    limiter.admit("10.0.0.1", now=0.0)
    with pytest.raises(Refusal) as refused:
        limiter.admit("10.0.0.1", now=0.1)
    assert (refused.value.status, refused.value.code) == (429, "join_rate")
    assert refused.value.headers == {"Retry-After": "1"}
    limiter.admit("10.0.0.2", now=0.1)  # another address has its own bucket
    limiter.admit("10.0.0.1", now=1.1)
    JoinLimiter(rate=0.0, burst=0).admit("anyone")  # rate 0: no limit


@pytest.mark.parametrize("trusted, expected", [
    (None, "testclient"),  # no proxy: the connection's address, whatever the header says
    ("192.0.2.9", "testclient"),  # a header from a connection that is not a trusted proxy is ignored
    ("testclient", "198.51.100.1"),  # the right-most address the trusted proxy did not add: the real client's
    ("testclient, 198.51.100.0/24", "203.0.113.7"),  # (with the proxy before it trusted too, the one before)
])
def test_the_client_address_is_uvicorns_reading_of_the_trusted_proxies(package: Package, tmp_path: Path,
                                                                        trusted: str | None, expected: str) -> None:
    """A client writes its own X-Forwarded-For (203.0.113.7), the proxy appends what it saw (198.51.100.1): only
    the appended address may be believed, and only from a trusted proxy (TestClient connects as "testclient")."""
    relay = make_relay(package, tmp_path / "s", forwarded_allow_ips=trusted)
    with serving(relay) as client:
        assert client.post("/api/join", json={}, headers={"X-Forwarded-For": "203.0.113.7, 198.51.100.1"}) \
            .status_code == 200
        listing = client.get("/api/admin/peers", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["peers"]
    assert [peer["address"] for peer in listing] == [expected]


def test_a_join_flood_from_one_address_is_limited_and_the_relay_stays_responsive(
        package: Package, tmp_path: Path) -> None:
    """1,000 joins from one address: the burst and what the rate refills are accepted, the rest get 429."""
    relay = make_relay(package, tmp_path / "s", join_rate=5.0, join_burst=20, max_peers_per_address=0)
    with serving(relay) as client:
        started = time.monotonic()
        codes: dict[int, int] = {}
        slowest_status = 0.0
        for index in range(1000):
            response = client.post("/api/join", json={})
            codes[response.status_code] = codes.get(response.status_code, 0) + 1
            if response.status_code == 429:
                assert response.json()["error"] == "join_rate" and int(response.headers["retry-after"]) >= 1
            if index % 100 == 0:
                asked = time.monotonic()
                assert session_status(client)["round"] == 0
                slowest_status = max(slowest_status, time.monotonic() - asked)
        seconds = time.monotonic() - started
        allowed = 20 + 5.0 * seconds + 1
        assert codes.get(200, 0) <= allowed and codes.get(200, 0) >= 20
        assert codes[429] == 1000 - codes[200]
        status = session_status(client)
        assert status["counters"]["refused.join_rate"] == codes[429]
        assert status["peers"]["joined"] == codes[200] and status["peers"]["addresses"] == 1
        assert slowest_status < 1.0  # the status page answered during the flood


def test_live_peers_per_address_are_capped(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", join_rate=0.0, max_peers_per_address=3,
                       forwarded_allow_ips="testclient")
    with serving(relay) as client:
        for _ in range(3):
            assert client.post("/api/join", json={}, headers={"X-Forwarded-For": "198.51.100.4"}).status_code == 200
        refused = client.post("/api/join", json={}, headers={"X-Forwarded-For": "198.51.100.4"})
        assert (refused.status_code, refused.json()["error"]) == (429, "too_many_peers")
        assert "Retry-After" in refused.headers
        other = client.post("/api/join", json={}, headers={"X-Forwarded-For": "198.51.100.5"})
        assert other.status_code == 200
        assert session_status(client)["peers"]["addresses"] == 2
