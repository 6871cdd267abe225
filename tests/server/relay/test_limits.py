"""Slow and silent clients against a real ``peertrain serve`` (``server.relay.limits``).

A peer that trickles its result a few bytes at a time gets ``408 body_timeout`` at the deadline while a request
on another connection is answered at once; a connection that sends nothing is closed at the head deadline, one
that sends part of a head gets ``408 header_timeout``; a declared body over the limit gets ``413 too_large``
before any of it is sent. Every refusal is counted by the relay like the endpoints' own.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.peer import Peer
from server.bench.load import relay_process
from server.cli import serve
from server.cli.commands import build_parser
from server.cli.options import read_limits, read_settings
from server.harness.peer import run_async
from server.harness.serve_command import ServeCommand
from server.relay.app import RelayPaths
from server.relay.limits import BodyLimits, restart_body_clock, uvicorn_settings
from server.relay.options import DEFAULT_BODY_TIMEOUT, RelayOptions, ServerLimits
from server.relay.refusal import Refusal
from server.session.config import SessionConfig
from server.session.settings import SettingError, arguments, declarations, declared, markdown_table

DEADLINE = 2.0  # --body-timeout and --header-timeout of the relay under test
# What a loaded 2-core machine may add to a deadline: the bounds show that a deadline is enforced at all (without
# one such a connection stays open for good), not how promptly (a wall-time bound is what failed under load).
SLACK = 30.0
ANSWERED_MEANWHILE = 2  # requests on other connections answered while the trickle is held
REPO_ROOT = Path(__file__).resolve().parents[3]


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser


LIMIT_FLAGS = ("--timeout-keep-alive", "--header-timeout", "--body-timeout", "--max-body-bytes",
               "--limit-concurrency", "--backlog", "--max-head-bytes")


def test_serve_shows_the_limits_with_their_defaults() -> None:
    parser = serve_parser()
    text = parser.format_help()
    for option in LIMIT_FLAGS:
        assert option in text
    limits = read_limits(parser.parse_args([]))
    assert limits == ServerLimits() and limits.body_timeout == DEFAULT_BODY_TIMEOUT
    settings = uvicorn_settings(limits)
    assert settings["limit_concurrency"] == limits.limit_concurrency and settings["backlog"] == limits.backlog
    with pytest.raises(ValueError, match="--body-timeout must be a number of seconds above 0, got 0"):
        read_limits(parser.parse_args(["--body-timeout", "0"]))


def test_the_limits_are_declared_once_with_the_relays_options(tmp_path: Path) -> None:
    """The flags, a --config file's keys, the bounds and the settings page's table all come from ``ServerLimits``."""
    assert tuple(item.flag for item in declarations(ServerLimits)) == LIMIT_FLAGS
    names = [set(declared(cls)) for cls in (SessionConfig, RelayOptions, ServerLimits)]
    assert all(a.isdisjoint(b) for a, b in itertools.combinations(names, 2))  # one file namespace for all three
    assert markdown_table(ServerLimits, ("serve",)) in (REPO_ROOT / "docs" / "sessions" / "settings.md").read_text()
    config = tmp_path / "serve.toml"
    config.write_text("header_timeout = 4\nbacklog = 64\nparticipants = 2\n")
    args = serve_parser().parse_args(["--config", str(config), "--backlog", "128"])  # a flag overrides the file
    assert read_limits(args) == ServerLimits(header_timeout=4, backlog=128)
    assert read_settings(args, "serve", environ={}) == ({"participants": 2}, {})  # (not the relay's options)
    config.write_text("max_head_bytes = 0\n")
    with pytest.raises(SettingError, match=re.escape(f"{config}: max_head_bytes must be 1 or more, got 0")):
        read_limits(serve_parser().parse_args(["--config", str(config)]))
    with pytest.raises(SettingError, match="limit_concurrency must be 1 or more, got 0"):
        ServerLimits(limit_concurrency=0)  # (built in code, checked as a flag is)
    config.write_text("backlog = 64\n")
    with pytest.raises(SettingError, match="backlog is not a setting of simulate"):
        read_settings(build_parser().parse_args(["simulate", "--config", str(config)]), "simulate")
    # An object says itself as serve's flags, as the harness hands RelayOptions to serve.
    limits = ServerLimits(body_timeout=DEADLINE, max_body_bytes=4096, backlog=16)
    assert read_limits(serve_parser().parse_args(arguments(limits, "serve"))) == limits


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Status, body and whether the relay closed the connection after it."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    body = await reader.readexactly(length)
    closed = await asyncio.wait_for(reader.read(1), timeout=SLACK) == b""
    return int(lines[0].split()[1]), body, closed


async def trickle(host: str, port: int, path: str, auth: str, body: bytes) -> tuple[int, bytes, bool, float, int]:
    """Send ``body`` two bytes every 0.25 s until the relay answers: (status, body, closed, seconds, bytes sent)."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    writer.write(f"POST {path} HTTP/1.1\r\nhost: relay\r\nauthorization: {auth}\r\n"
                 f"content-length: {len(body)}\r\n\r\n".encode())
    answer = asyncio.ensure_future(read_answer(reader))
    sent = 0
    while not answer.done() and sent < len(body):
        writer.write(body[sent:sent + 2])
        sent += 2
        await asyncio.wait({answer}, timeout=0.25)
    status, text, closed = await asyncio.wait_for(answer, timeout=DEADLINE + SLACK)
    writer.close()
    return status, text, closed, time.monotonic() - started, sent


async def meanwhile(url: str, auth: str, answered: asyncio.Event) -> int:
    """Requests on other connections until the trickle is answered (at most 100 rounds): how many were answered
    while it still went on. (None would be, were the trickle holding the event loop or the relay.)"""
    during = 0
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for _ in range(100):
            if answered.is_set():
                break
            assert (await client.get("/api/session")).status_code == 200
            assert (await client.get("/api/weights", headers={"Authorization": auth})).status_code == 200
            during += not answered.is_set()
    return during


async def silent_and_partial(host: str, port: int) -> tuple[float, tuple[int, bytes, bool], float]:
    """A connection that sends nothing (seconds until closed); one that sends half a head (its answer)."""
    started = time.monotonic()
    quiet_reader, quiet_writer = await asyncio.open_connection(host, port)
    partial_reader, partial_writer = await asyncio.open_connection(host, port)
    partial_writer.write(b"POST /api/result?round=0&slot=0 HTTP/1.1\r\nhost: re")
    assert await asyncio.wait_for(quiet_reader.read(), timeout=DEADLINE + SLACK) == b""
    quiet = time.monotonic() - started
    answer = await asyncio.wait_for(read_answer(partial_reader), timeout=DEADLINE + SLACK)
    partial = time.monotonic() - started
    quiet_writer.close()
    partial_writer.close()
    return quiet, answer, partial


async def cut_off(host: str, port: int, path: str, auth: str) -> None:
    """Half a body, then the client goes (a tab closed mid-upload)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"POST {path} HTTP/1.1\r\nhost: relay\r\nauthorization: {auth}\r\n"
                 "content-length: 1000\r\n\r\n".encode() + b"x" * 500)
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()
    await asyncio.sleep(0.3)


async def too_large(host: str, port: int, auth: str) -> tuple[int, bytes, bool]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"POST /api/result?round=0&slot=0 HTTP/1.1\r\nhost: relay\r\nauthorization: {auth}\r\n"
                 "content-length: 100000000\r\n\r\n".encode())  # and never a byte of it
    answer = await asyncio.wait_for(read_answer(reader), timeout=SLACK)
    writer.close()
    return answer


@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
@pytest.mark.usefixtures("majority_importable")  # the peer imports majority_task as the relay does
def test_a_trickled_upload_gets_408_at_the_deadline_while_others_are_answered_at_once(tmp_path: Path) -> None:
    serve = ServeCommand(task="majority_task:MajorityTask", task_settings={"chunks": 4, "examples": 1024},
                         session_dir=tmp_path / "session", config=SessionConfig(participants=1, passes=2),
                         options=RelayOptions(admin_token="a"),
                         limits=ServerLimits(body_timeout=DEADLINE, header_timeout=DEADLINE))
    with relay_process(serve, tmp_path / "serve.log") as relay:
        host, port = relay.host_port
        with httpx.Client(base_url=relay.url, timeout=10) as client:
            joined = client.post("/api/join", json={}).json()
            auth = f"Bearer {joined['peer_id']}:{joined['token']}"
            peer = Peer(client.get("/api/task").json())
            headers = {"Authorization": auth}
            job = client.post("/api/work", headers=headers).json()
            peer.set_weights(client.get("/api/weights", headers=headers).content)
            body = peer.train(job, client.get(f"/api/unit/{job['unit_index']}", headers=headers).content)
            assert len(body) > 4 * DEADLINE / 0.25  # the trickle cannot finish before the deadline

            async def both() -> tuple[tuple[int, bytes, bool, float, int], int]:
                path = f"/api/result?round={job['round']}&slot={job['slot']}"
                answered = asyncio.Event()

                async def trickled() -> tuple[int, bytes, bool, float, int]:
                    try:
                        return await trickle(host, port, path, auth, body)
                    finally:
                        answered.set()

                return await asyncio.gather(trickled(), meanwhile(relay.url, auth, answered))

            (status, text, closed, seconds, sent), others = run_async(both)
            assert status == 408 and json.loads(text)["error"] == "body_timeout", text
            assert closed, "the relay must close the connection of a refused trickle"
            assert DEADLINE <= seconds < DEADLINE + SLACK and sent < len(body)
            assert others >= ANSWERED_MEANWHILE, others  # the trickle held neither the event loop nor the relay

            quiet, (partial_status, partial_text, partial_closed), partial = run_async(
                lambda: silent_and_partial(host, port))
            assert DEADLINE * 0.9 <= quiet < DEADLINE + SLACK
            assert partial_status == 408 and json.loads(partial_text)["error"] == "header_timeout" and partial_closed
            assert DEADLINE * 0.9 <= partial < DEADLINE + SLACK

            large_status, large_text, large_closed = run_async(lambda: too_large(host, port, auth))
            assert large_status == 413 and json.loads(large_text)["error"] == "too_large" and large_closed

            run_async(lambda: cut_off(host, port, f"/api/result?round={job['round']}&slot={job['slot']}", auth))

            # The peer still holds its lease: an honest upload now is accepted.
            assert client.post(f"/api/result?round={job['round']}&slot={job['slot']}", content=body,
                               headers=headers).status_code == 200
            counters = client.get("/api/session").json()["counters"]
    assert counters["refused.body_timeout"] == 1 and counters["refused.too_large"] == 1
    assert counters["refused.header_timeout"] == 1 and counters["bodies_cut_off"] == 1
    assert "Exception in ASGI application" not in (tmp_path / "serve.log").read_text()


@pytest.mark.parametrize("restarted", [True, False])
def test_an_upload_that_waits_its_turn_gets_its_whole_body_timeout_once_the_turn_comes(restarted: bool) -> None:
    """``POST /api/result`` reads at most ``UPLOADS`` bodies at once (a crowd's bodies would otherwise all sit in the
    relay's memory); an upload waiting its turn must not be refused as a slow body. Here one turn, held by the test
    past the body timeout: the upload, complete all along, is accepted once the turn comes; without
    ``restart_body_clock`` it is a 408."""
    timeout = 0.3
    turn = asyncio.Semaphore(1)
    waiting = asyncio.Event()

    async def upload(request: Request) -> Response:
        waiting.set()
        async with turn:
            if restarted:
                restart_body_clock(request.scope)
            body = await request.body()
        return JSONResponse({"bytes": len(body)})

    app = Starlette(routes=[Route("/up", upload, methods=["POST"])],
                    middleware=[Middleware(BodyLimits, timeout=timeout, max_bytes=lambda: 1 << 20)],
                    exception_handlers={Refusal: lambda request, error: JSONResponse(
                        error.to_json(), status_code=error.status)})

    async def ready_body() -> AsyncIterator[bytes]:  # (in two parts, as a large body comes: the read waits once)
        yield b"z" * 10
        await asyncio.sleep(0)
        yield b"z" * 10

    async def held_turn() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://relay") as client:
            async with turn:  # (the turn another upload holds, released only once the body timeout has passed)
                upload_task = asyncio.create_task(
                    client.post("/up", content=ready_body(), headers={"content-length": "20"}))
                await waiting.wait()  # the upload's head came and its body clock runs
                await asyncio.sleep(3 * timeout)  # (a lower bound: the upload waits at least this long)
            return await upload_task

    second = run_async(held_turn)
    if restarted:
        assert second.status_code == 200 and second.json() == {"bytes": 20}, second.text
    else:
        assert second.status_code == 408 and second.json()["error"] == "body_timeout", second.text
