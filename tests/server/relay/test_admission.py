"""Admission: joins per client address (a rate after a burst, first come first served: 429 with Retry-After and a
ticket that keeps the join's place), live peers per address, the client address through a trusted proxy header."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from relay_fixtures import ADMIN_TOKEN, make_relay, serving, session_status

from runtime.protocol import Joined
from server.harness.peer import AsyncTransport, RelayPeer, pooled, run_async
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.admission import JOIN_QUEUE, TICKET_GRACE_S, JoinLimiter
from server.relay.options import RelayOptions
from server.relay.refusal import Refusal
from server.session.package import Package

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"  # (kept by CI: tests/artifacts)


def refused(limiter: JoinLimiter, address: str, now: float, ticket: str = "") -> Refusal:
    with pytest.raises(Refusal) as refusal:
        limiter.admit(address, now, ticket=ticket)
    assert (refusal.value.status, refusal.value.code) == (429, "join_rate")
    return refusal.value


def test_the_limiter_refuses_with_retry_after_and_keeps_addresses_apart() -> None:
    limiter = JoinLimiter(rate=1.0, burst=2)
    limiter.admit("10.0.0.1", now=0.0)
    limiter.admit("10.0.0.1", now=0.0)
    refusal = refused(limiter, "10.0.0.1", 0.1)
    assert refusal.headers == {"Retry-After": "1"} and refusal.body["ticket"]  # its turn: 1.0 (0.9 s away)
    limiter.admit("10.0.0.2", now=0.1)  # another address has its own queue
    JoinLimiter(rate=0.0, burst=0).admit("anyone")  # rate 0: no limit


def test_joiners_behind_one_address_get_in_in_the_order_they_asked() -> None:
    """A burst of 2, then 2 a second: the refused are given turns 0.5 s apart in the order they asked; a newcomer
    without a ticket cannot take a turn promised to another, and each ticket admits at its turn."""
    limiter = JoinLimiter(rate=2.0, burst=2)
    limiter.admit("nat", 0.0)
    limiter.admit("nat", 0.0)
    tickets = [refused(limiter, "nat", 0.0).body["ticket"] for _ in range(4)]
    assert [float(t.split(".")[1]) / 1000 for t in tickets] == [0.5, 1.0, 1.5, 2.0]
    late = refused(limiter, "nat", 0.6)  # a newcomer after them, at a time the first turn has come
    assert float(late.body["ticket"].split(".")[1]) / 1000 == 2.5 and late.headers == {"Retry-After": "2"}
    early = refused(limiter, "nat", 0.8, tickets[1])  # shown early: the same ticket, the seconds to its turn
    assert early.body["ticket"] == tickets[1] and early.headers == {"Retry-After": "1"}
    for index, ticket in enumerate(tickets):
        limiter.admit("nat", 0.5 * (index + 1), ticket=ticket)
    assert float(refused(limiter, "nat", 2.0).body["ticket"].split(".")[1]) / 1000 == 3.0  # the rate held


def test_a_ticket_is_good_once_at_its_address_and_only_for_a_while() -> None:
    """A ticket not signed for this address and turn, or used already, or expired, keeps no place: the join queues
    as a new one (at times the queue is still behind, so it is refused with a ticket of its own)."""
    limiter = JoinLimiter(rate=1.0, burst=1)
    limiter.admit("nat", 0.0)
    ticket = refused(limiter, "nat", 0.0).body["ticket"]  # turn 1.0
    for forged in (ticket.replace(".1000.", ".0."), ticket[:-1] + ("0" if ticket[-1] != "0" else "1"), "x.y.z", "1"):
        assert refused(limiter, "nat", 0.5, forged).body["ticket"] != ticket
    limiter.admit("10.0.0.9", 0.0)
    assert refused(limiter, "10.0.0.9", 0.5, ticket).body["ticket"] != ticket  # another address's ticket
    limiter.admit("nat", 1.0, ticket=ticket)
    assert refused(limiter, "nat", 1.0, ticket).body["ticket"] != ticket  # used once already
    behind = refused(limiter, "nat", 1.0).body["ticket"]
    turn = float(behind.split(".")[1]) / 1000
    flood = JoinLimiter(rate=1.0, burst=1, secret=limiter.secret, queues=limiter.queues)
    flood.queues["nat"].due = turn + TICKET_GRACE_S + 10  # (joins since kept the queue behind)
    assert refused(flood, "nat", turn + TICKET_GRACE_S + 1, behind).body["ticket"] != behind  # expired


def test_a_flood_fills_its_own_queue_and_then_gets_no_ticket() -> None:
    limiter = JoinLimiter(rate=10.0, burst=1)
    limiter.admit("flood", 0.0)
    places = [refused(limiter, "flood", 0.0) for _ in range(JOIN_QUEUE)]
    assert all(p.body.get("ticket") for p in places)
    full = refused(limiter, "flood", 0.0)
    assert "ticket" not in full.body and "queue is full" in full.message
    limiter.admit("neighbour", 0.0)  # other addresses are not behind it


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


@pytest.mark.slow
def test_two_hundred_joiners_behind_one_address_all_get_in_in_turn(tmp_path: Path) -> None:
    """200 peers (the one Python peer, on one event loop) join a real relay from one address at once: the burst gets
    in, every other joiner is refused once with a ticket and admitted when it comes back at Retry-After, so no one
    starves and the last is in within (n - burst) / rate seconds, the Retry-After's rounding up (1 s) and the
    requests' own time (given 10 s here, for a loaded machine)."""
    joiners, rate, burst = 200, 20.0, 20
    serve = ServeCommand(task="majority_task:MajorityTask", task_settings={"chunks": 6}, session_dir=tmp_path / "s",
                         options=RelayOptions(admin_token=ADMIN_TOKEN, join_rate=rate, join_burst=burst,
                                              max_peers_per_address=0))

    async def crowd(url: str) -> list[tuple[object, float, int]]:
        limits = pooled(joiners)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
            transport, started = AsyncTransport(http), time.monotonic()

            async def one() -> tuple[object, float, int]:
                peer = RelayPeer(join_tries=10, deadline=started + 120)
                joined = await transport.run(peer.sign_in())
                return joined, time.monotonic() - started, peer.log.join_waits

            return list(await asyncio.gather(*(one() for _ in range(joiners))))

    with RelayProcess(serve, log=tmp_path / "serve.log", examples=True) as relay:
        answers = run_async(lambda: crowd(relay.url))
        status = relay.client().status()
    failed = [joined for joined, _, _ in answers if not isinstance(joined, Joined)]
    assert not failed, failed[:3]
    waits = Counter(w for _, _, w in answers)  # (joins the crowd's first requests sent late may fit the rate)
    assert set(waits) <= {0, 1} and waits[0] >= burst, waits  # refused once at most: the ticket admitted at its turn
    longest = max(seconds for _, seconds, _ in answers)
    bound = (joiners - burst) / rate + 1
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "join-200-one-address.txt").write_text(
        f"{joiners} joiners, burst {burst}, rate {rate:g}/s: the last in after {longest:.2f} s (bound {bound:g} s "
        f"and the requests' time); refused.join_rate {status['counters'].get('refused.join_rate')}\n")
    assert longest <= bound + 10, longest
    assert status["peers"]["joined"] == joiners and status["counters"]["refused.join_rate"] == waits[1]
