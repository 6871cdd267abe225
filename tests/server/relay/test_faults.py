"""Faults found by fuzzing the relay (issue 16, and ``peertrain bench fuzz``), each pinned by a test.

Two were found by a fuzzer before this one existed, and are tried against a real ``peertrain serve``
subprocess (a TestClient has no real connections): a non-UTF-8 body to ``POST /api/admin/session`` answered 500
(now 400 ``bad_json``: a ``UnicodeDecodeError`` is a ``ValueError``), and a ``HEAD /api/events`` left its
keep-alive connection busy with the event stream, so the next request on it hung (now the headers come at once
and the connection is free). Two more were found by ``peertrain bench fuzz`` itself: a session request of
10^15 passes hung the relay while it planned the schedule, and every request that came while a session was
being replaced met the old session's closed store (500s; for good, once a replacement hung).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from relay_fixtures import ADMIN_TOKEN, build_small_package, make_relay, serving

from server.bench.fuzz_relay import ADMIN, relay_process
from server.relay.admin import MAX_PLANNED_UNITS
from server.relay.app import RelayPaths

needs_setup = pytest.mark.skipif(bool(RelayPaths().missing()),
                                 reason="set-up has not built web/node_modules and wheels/")


@pytest.fixture(scope="module")
def relay_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with relay_process(tmp_path_factory.mktemp("faults")) as url:
        yield url


def read_response(sock: socket.socket, *, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response off ``sock``: status, headers, body (by Content-Length; none for HEAD)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the connection closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    length = 0 if head_only else int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the connection closed inside the body")
        rest += chunk
    assert len(rest) == length, f"bytes after the response: {rest[length:]!r}"
    return int(status_line.split()[1]), headers, rest


@needs_setup
def test_a_non_utf8_admin_session_body_is_a_400_with_a_code(relay_url: str) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=relay_url, timeout=10) as client:
        for body in (b"\xff\xfe\x00\x01", b'{"passes": "\xe9"}', b"\xc3"):
            answer = client.post("/api/admin/session", content=body, headers=admin)
            assert answer.status_code == 400, (body, answer.text)
            assert answer.json()["error"] == "bad_json" and "not valid JSON" in answer.json()["message"]
        assert client.get("/api/session").status_code == 200  # and the relay serves on


@needs_setup
def test_after_head_events_the_same_connection_answers_the_next_request_at_once(relay_url: str) -> None:
    parts = urlsplit(relay_url)
    assert parts.hostname == "127.0.0.1" and parts.port
    host = f"{parts.hostname}:{parts.port}"
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.settimeout(2.0)  # "at once": a busy connection would time out here
        started = time.monotonic()
        sock.sendall(f"HEAD /api/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        status, headers, _ = read_response(sock, head_only=True)
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        assert headers.get("connection", "keep-alive").lower() != "close"
        for _ in range(2):  # the next requests on the very same connection
            sock.sendall(f"GET /api/session HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            status, headers, body = read_response(sock)
            assert status == 200 and "round" in json.loads(body)
        sock.sendall(f"HEAD /api/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert read_response(sock, head_only=True)[0] == 200
        sock.sendall(f"GET /api/task HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert read_response(sock)[0] == 200
        assert time.monotonic() - started < 2.0


@needs_setup
def test_after_head_events_a_one_connection_pool_serves_on(relay_url: str) -> None:
    """As a proxy's pooled connection would: httpx with a single connection, HEAD then GETs."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=relay_url, timeout=2.0, limits=limits) as client:
        for _ in range(3):
            assert client.head("/api/events").status_code == 200
            assert client.get("/api/session").status_code == 200


def test_a_session_request_that_plans_too_many_units_is_refused_at_once(tmp_path: Path) -> None:
    """10^15 passes hung the relay: starting a session builds its whole schedule (the old store already closed)."""
    relay = make_relay(build_small_package(tmp_path / "package"), tmp_path / "session")
    with serving(relay) as client:
        started = time.monotonic()
        answer = client.post("/api/admin/session", json={"passes": 10**15, "participants": 1, "replace": True},
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert (answer.status_code, answer.json()["error"]) == (422, "bad_session")
        assert str(MAX_PLANNED_UNITS) in answer.json()["message"] and time.monotonic() - started < 5
        assert client.get("/api/session").json()["round"] == 0


def test_requests_while_a_session_is_replaced_answer_503_replacing(tmp_path: Path) -> None:
    """While the old session's files move its store is closed: requests meanwhile get 503 replacing, not 500."""
    relay = make_relay(build_small_package(tmp_path / "package"), tmp_path / "session")
    moving, release = threading.Event(), threading.Event()
    replace_blocking = relay.admin.replace_blocking

    def slow_replace(*args: Any) -> Path:
        moving.set()
        assert release.wait(10)
        return replace_blocking(*args)

    relay.admin.replace_blocking = slow_replace  # type: ignore[method-assign,assignment]
    with serving(relay) as client:
        replaced: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: replaced.update(answer=client.post(
            "/api/admin/session", json={"replace": True}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})))
        worker.start()
        try:
            assert moving.wait(10)
            relay.store.close()  # (as replace_blocking does first; a request reaching the store would 500)
            for method, path in (("GET", "/api/session"), ("POST", "/api/join"), ("POST", "/api/work"),
                                 ("GET", "/api/admin/peers")):
                answer = client.request(method, path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                assert (answer.status_code, answer.json()["error"]) == (503, "replacing"), (method, path)
                assert answer.headers["retry-after"] == "1"
        finally:
            release.set()
            worker.join(20)
        assert replaced["answer"].status_code == 200, replaced["answer"].text
        assert client.get("/api/session").status_code == 200
        assert client.post("/api/join", json={}).status_code == 200
