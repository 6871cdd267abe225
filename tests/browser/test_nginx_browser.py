"""A public session behind Debian's nginx running ``deploy/nginx.conf``: TLS from a throw-away CA, the relay on
plain HTTP behind it with ``--forwarded-allow-ips 127.0.0.1``.

- A page opened over ``https://`` in Chromium that trusts the certificate trains the session to the end; it is a
  secure context and cross-origin isolated, and ``navigator.gpu`` exists; a status change reaches the page through
  the proxy at once (the event stream is not buffered); weights by digest come from nginx's cache the second time.
- A client that writes ``X-Forwarded-For: 203.0.113.7`` itself is counted, limited and banned under the address
  nginx saw (a client bound to 127.0.0.2), never under the one it wrote.
- 2 attackers, then 40 honest native peers at once, behind one address (a classroom's NAT) through nginx: the
  attackers are banned, the honest peers all join (the join rate holds the last ones back a few seconds) and train
  to the end.
"""

from __future__ import annotations

import dataclasses
import ssl
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from browser_helpers import ADMIN_TOKEN, ARITH_SETTINGS, ARTIFACTS, BOOT_SECONDS
from nginx_proxy import free_port, nginx_in_front
from playwright.sync_api import BrowserType, Page

from runtime import deltas, wire
from server.browser.chromium import launch_options
from server.browser.peers import join_url
from server.harness.native_peer import Job, NativePeer, PeerHooks
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.client import Credentials, RelayClient, result_call
from server.relay.options import RelayOptions
from server.session.config import SessionConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LATENCY_TRIES = 3


def relay_behind_proxy(tmp_path: Path, *, options: RelayOptions | None = None, settings: dict | None = None,
                       k: int = 2) -> RelayProcess:
    """An arith session of one pass, k units a round, whose relay believes the X-Forwarded-For of a proxy on
    127.0.0.1; ``options``: the relay's others (default: the tests' admin token)."""
    options = replace(options or RelayOptions(admin_token=ADMIN_TOKEN), forwarded_allow_ips="127.0.0.1")
    serve = ServeCommand(task="arith", task_settings=settings or ARITH_SETTINGS, session_dir=tmp_path / "s",
                         config=SessionConfig(participants=k, passes=1), options=options, port=free_port())
    relay = RelayProcess(serve, log=ARTIFACTS / f"relay-{tmp_path.name}.log")
    relay.start()
    return relay


def shown_status(page: Page) -> str:
    return str(page.evaluate("document.getElementById('session-status').textContent"))


def status_latency(page: Page, proxy: httpx.Client, action: str, expect: str) -> float:
    """Seconds from an admin action answered (through the proxy) to the page showing ``expect`` in its status."""
    answered = proxy.post(f"/api/admin/{action}", headers=ADMIN)
    assert answered.status_code == 200, answered.text
    sent = time.monotonic()
    for _ in range(600):  # (bounded: 60 s of 0.1 s polls; a buffered stream would never show it)
        if expect in shown_status(page):
            return time.monotonic() - sent
        page.wait_for_timeout(100)
    raise AssertionError(f"the page never showed {expect!r} after {action}: {shown_status(page)!r}")


def test_a_page_behind_nginx_trains_securely_and_hears_the_stream_at_once(browser_type: BrowserType,
                                                                          tmp_path: Path) -> None:
    relay = relay_behind_proxy(tmp_path)
    try:
        with nginx_in_front(relay.host_port[1], tmp_path / "nginx") as (url, issued):
            options = launch_options()
            browser = browser_type.launch(**{**options, "args": [
                *options["args"], f"--ignore-certificate-errors-spki-list={issued.spki}"]})
            trusted = ssl.create_default_context(cafile=str(issued.authority))
            try:
                with httpx.Client(base_url=url, verify=trusted, timeout=30) as proxy:
                    page = browser.new_page()
                    page.goto(url + "/")  # watching first (not joined): the session waits for its first peer
                    for _ in range(BOOT_SECONDS * 2):  # (bounded) until the stream's first status is shown
                        if shown_status(page) not in ("", "…"):
                            break
                        page.wait_for_timeout(500)
                    latencies = []
                    for _ in range(LATENCY_TRIES):
                        latencies.append(status_latency(page, proxy, "pause", "paused"))
                        latencies.append(status_latency(page, proxy, "resume", "wait for a peer"))
                    page.goto(join_url(url + "/"))
                    status = proxy.get("/api/session").json()
                    for _ in range(BOOT_SECONDS * 2):
                        if status["done"]:
                            break
                        page.wait_for_timeout(500)
                        status = proxy.get("/api/session").json()
                    assert status["done"], status
                    facts = page.evaluate("[location.protocol, isSecureContext, crossOriginIsolated, "
                                          "'gpu' in navigator]")
                    assert facts == ["https:", True, True, True]
                    # The relay saw nginx's reading of the page's address (this machine), not nginx itself as a peer.
                    listing = proxy.get("/api/admin/peers", headers=ADMIN).json()["peers"]
                    assert [p["address"] for p in listing] == ["127.0.0.1"]
                    digest = current_digest(proxy)
                    first = proxy.get(f"/api/weights/{digest}")
                    again = proxy.get(f"/api/weights/{digest}")
                    assert (first.status_code, again.status_code) == (200, 200) and first.content == again.content
                    assert again.headers["x-cache-status"] == "HIT", again.headers
            finally:
                browser.close()
    finally:
        relay.close()
    # Unbuffered: a status change crossed nginx at once (the relay sends a change within its 0.5 s coalescing).
    assert min(latencies) < 1.0, latencies
    (ARTIFACTS / "nginx-stream-latency.txt").write_text(" ".join(f"{s:.3f}" for s in latencies) + "\n")


def current_digest(proxy: httpx.Client) -> str:
    """The digest a job would name for the current weights: a peer joins through the proxy and hashes them."""
    client = RelayClient(proxy)
    client.join()
    _, vector = wire.decode(client.weights())
    return deltas.weights_sha256(vector)


def test_a_forged_forwarded_for_is_ignored_through_nginx(tmp_path: Path) -> None:
    options = RelayOptions(admin_token=ADMIN_TOKEN, join_burst=2, join_rate=0.001)
    relay = relay_behind_proxy(tmp_path, options=options)
    try:
        with nginx_in_front(relay.host_port[1], tmp_path / "nginx") as (url, issued):
            trusted = ssl.create_default_context(cafile=str(issued.authority))
            # A client on 127.0.0.2 (nginx sees that address) that claims to be 203.0.113.7, then others.
            transport = httpx.HTTPTransport(local_address="127.0.0.2", verify=trusted)
            with httpx.Client(base_url=url, transport=transport, timeout=30) as client, \
                    httpx.Client(base_url=url, verify=trusted, timeout=30) as admin:
                answers = [client.post("/api/join", json={}, headers={"X-Forwarded-For": forged})
                           for forged in ("203.0.113.7", "203.0.113.8", "198.51.100.1, 203.0.113.9")]
                # The first one lies about its example count, still claiming 203.0.113.7: banned at once.
                liar = RelayClient(client, Credentials(answers[0].json()["peer_id"], answers[0].json()["token"]))
                job = liar.work()
                header, weights = wire.decode(liar.weights())
                lie = wire.encode(weights, dataclasses.replace(header, num_examples=10**9,
                                                               meta={"slot": job["slot"]}))
                refused = liar.send(result_call(job["round"], job["slot"], lie),
                                    headers={**liar.credentials.headers, "X-Forwarded-For": "203.0.113.7"})
                listing = admin.get("/api/admin/peers", headers=ADMIN).json()["peers"]
                counters = admin.get("/api/session").json()["counters"]
    finally:
        relay.close()
    assert [a.status_code for a in answers] == [200, 200, 429]  # a burst of 2 for its real address, whatever it wrote
    assert [p["address"] for p in listing] == ["127.0.0.2", "127.0.0.2"]
    assert counters["refused.join_rate"] == 1
    assert (refused.status_code, refused.json()["error"]) == (422, "num_examples_claim")
    assert [(p["address"], p["banned"]) for p in listing] == [("127.0.0.2", True), ("127.0.0.2", False)]


@pytest.mark.timeout(1800)  # 42 peers and every peer's first result replayed, on two cores others may share
def test_forty_volunteers_and_two_attackers_behind_one_address(tmp_path: Path) -> None:
    def flipped(job: Job, honest: bytes) -> bytes:
        header, vector = wire.decode(honest)  # (arith's results are float32 weights: its default codec)
        return wire.encode((-4 * vector).astype("float32"), header)

    settings = {**ARITH_SETTINGS, "num_examples": 2100, "chunks": 42}
    options = RelayOptions(admin_token=ADMIN_TOKEN, lease_seconds=600)
    relay = relay_behind_proxy(tmp_path, options=options, settings=settings, k=21)
    try:
        with nginx_in_front(relay.host_port[1], tmp_path / "nginx") as (url, issued):
            trusted = ssl.create_default_context(cafile=str(issued.authority))
            honest = [NativePeer(url, verify=trusted, timeout_s=1500) for _ in range(40)]
            attackers = [NativePeer(url, verify=trusted, timeout_s=1500, hooks=PeerHooks(upload=flipped))
                         for _ in range(2)]
            started = time.monotonic()
            # The attackers come first and each sends a result before the class arrives: alone in the session, their
            # units have no backup to lose a race to, so the relay reads both (when all 42 started together, a
            # fresh-clone run of 590d470 saw both attackers' only uploads refused as a stale round: backups had
            # finished their units, nothing was judged). Then the 40 ask to join at once behind the same address.
            for peer in attackers:
                peer.start()
            for _ in range(6000):  # (bounded: 600 s of 0.1 s polls, for an upload answered or a peer ended)
                if all(peer.log.results or peer.ended for peer in attackers):
                    break
                time.sleep(0.1)
            assert all(peer.log.results for peer in attackers), [(p.ended, p.error) for p in attackers]
            for peer in honest:
                peer.start()
            for peer in [*honest, *attackers]:
                peer.join(1500)
            seconds = time.monotonic() - started
            with httpx.Client(base_url=url, verify=trusted, timeout=30) as admin:
                status = admin.get("/api/session").json()
                listing = admin.get("/api/admin/peers", headers=ADMIN).json()["peers"]
    finally:
        relay.close()
    assert status["done"], status["waiting"]
    assert [peer.ended for peer in honest] == ["done"] * 40, [peer.error for peer in honest if peer.ended != "done"]
    # Both attackers are banned (the listing below); one is told so unless the session ended before it asked again.
    assert all(peer.ended in {"banned", "done"} for peer in attackers), [(p.ended, p.log.refusals) for p in attackers]
    banned = {p["peer_id"] for p in listing if p["banned"]}
    assert banned == {peer.peer_id for peer in attackers}, ([(p.peer_id, p.log.results) for p in attackers], banned)
    assert {p["address"] for p in listing} == {"127.0.0.1"} and len(listing) == 42  # one address, all admitted
    trained = sum(peer.log.trained for peer in honest)
    waits = sum(peer.log.join_waits for peer in [*honest, *attackers])
    # In turn: each joiner past the burst was refused once, with a ticket, and admitted at its turn; the last within
    # (42 - burst) / rate s of its first ask, the Retry-After's rounding up (1 s) and the requests' time.
    longest = max(s for peer in [*honest, *attackers] for s in peer.log.join_seconds)
    bound = (42 - options.join_burst) / options.join_rate + 1
    (ARTIFACTS / "nat-42-peers.txt").write_text(f"{seconds:.1f} s, {trained} honest units, {waits} join waits, "
                                                f"the longest wait to join {longest:.1f} s (bound {bound:g} s and "
                                                f"the requests' time), counters {status['counters']}\n")
    assert max(peer.log.join_waits for peer in [*honest, *attackers]) <= 1
    assert longest <= bound + 30, longest  # (30 s: the requests' own time on two loaded cores)
