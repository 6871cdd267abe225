"""Limits that keep slow or silent clients from holding a round, the event loop or the relay's connections.

uvicorn alone bounds little of what a slow client does: a connection that opens and sends nothing, or sends a
request head a byte at a time, has no deadline at all (its keep-alive timer starts only after a first
response), and a request body is read for as long as the client keeps trickling it. A trickled result ties up
a connection and a request task; a round is not held by it (a backup races its unit, and its lease expires),
but enough of them would exhaust the connections ``--limit-concurrency`` allows. So ``peertrain serve`` runs:

* ``HeadTimeoutProtocol`` (uvicorn's h11 protocol with a deadline): a connection must deliver a complete
  request head within ``--header-timeout`` seconds of opening, or of its previous response; otherwise it is
  closed (with a ``408 header_timeout`` when part of a head had come). An idle keep-alive connection is closed
  after ``--timeout-keep-alive`` seconds, as uvicorn does.
* ``BodyLimits`` (ASGI middleware): a request body must arrive in full within ``--body-timeout`` seconds of
  its head, else the request is refused with ``408 body_timeout`` (the endpoint reading it gets the
  ``Refusal``, which is counted like every other) and the connection is closed; a declared
  ``Content-Length`` over ``--max-body-bytes`` is refused with ``413 too_large`` before a byte of the body is
  read, and a streamed body is cut off there. (The endpoints' own, smaller limits still apply.)
* the same protocol sets ``TCP_NODELAY`` on every connection (``no_delay``).
* uvicorn's own limits, set explicitly: ``--limit-concurrency`` (open connections or requests in flight beyond
  it get uvicorn's plain ``503``), ``--backlog`` (the listen queue), ``--max-head-bytes`` (a request head
  larger than this gets uvicorn's ``400``).

``server.relay.options.ServerLimits`` declares them (``serve``'s flags, a ``--config`` file's keys, their bounds);
this module enforces them.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import h11
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.relay.options import ServerLimits
from server.relay.refusal import Refusal

NO_BODY_LIMIT = 64 * 1024  # the largest body when nothing says otherwise (the page and assets take none)
FILE_DESCRIPTOR_MARGIN = 64  # descriptors beyond the connections: SQLite, the session's files, logs


def uvicorn_settings(limits: ServerLimits, on_header_timeout: Callable[[], None] | None = None) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config``: the limits uvicorn enforces and the protocol with the head deadline
    (``on_header_timeout`` is called for each head refused)."""
    # proxy_headers off: uvicorn's own default trusts X-Forwarded-For from 127.0.0.1; the app applies the same
    # middleware with the host's explicit list (``serve --forwarded-allow-ips``) instead.
    return {"proxy_headers": False,
            "timeout_keep_alive": limits.timeout_keep_alive, "limit_concurrency": limits.limit_concurrency,
            "backlog": limits.backlog, "h11_max_incomplete_event_size": limits.max_head_bytes,
            "http": head_timeout_protocol(limits.header_timeout, on_header_timeout)}


def raise_file_limit(connections: int) -> int:
    """Raise the soft limit on open files so that ``connections`` fit (up to the hard limit); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + FILE_DESCRIPTOR_MARGIN
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


# ---------------------------------------------------------------- request heads


def refusal_bytes(refusal: Refusal) -> bytes:
    """A complete HTTP/1.1 response for ``refusal`` that closes the connection (for use below the ASGI app)."""
    body = json.dumps(refusal.to_json()).encode()
    head = (f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Send small writes at once (TCP_NODELAY). asyncio sets it only on sockets made with ``IPPROTO_TCP``, not on
    those accepted from ``serve``'s socket (protocol 0): a response's head and body went out as two segments, the
    second held by Nagle's algorithm until the client's delayed ACK, ~40 ms on every keep-alive request."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def head_timeout_protocol(seconds: float, on_timeout: Callable[[], None] | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol where a request head must be complete ``seconds`` after the connection opened or
    answered its previous request; ``on_timeout`` is told of each partial head refused."""

    class HeadTimeoutProtocol(H11Protocol):
        head_seconds = seconds
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            no_delay(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a complete head came: the body has its own deadline
                self._cancel_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm_head_timer()  # (a pipelined request already parsed leaves their_state past IDLE)

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(self.head_seconds, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # (a response in progress: not waiting for a head)
            if self.conn.trailing_data[0]:  # part of a head came: say why it is closed
                self.transport.write(refusal_bytes(Refusal(
                    408, "header_timeout", f"the request head did not arrive within {self.head_seconds:g} s")))
                if on_timeout is not None:
                    on_timeout()
            self.transport.close()

    return HeadTimeoutProtocol


# ---------------------------------------------------------------- request bodies


def plain_refusal_response(request: Request, refusal: Exception) -> Response:
    """A refusal's JSON answer where no relay counts it (the page-only app)."""
    assert isinstance(refusal, Refusal)
    return JSONResponse(refusal.to_json(), status_code=refusal.status,
                        headers=refusal.headers)


BODY_CLOCK = "peertrain.body_clock"  # the scope key of a request's body deadline (``restart_body_clock``)


def restart_body_clock(scope: Scope) -> None:
    """The request's body has ``timeout`` seconds from now, not from its head: an endpoint that lets uploads wait
    their turn before reading them (``POST /api/result``) calls this when the turn comes, so that waiting is not
    counted as a slow body. Nothing once any of the body came, or outside ``BodyLimits``."""
    body = scope.get(BODY_CLOCK)
    if isinstance(body, _Body) and body.size == 0 and not body.complete:
        body.deadline = asyncio.get_running_loop().time() + body.timeout


class _Body:
    """The request's ``receive``, refusing a body past its deadline or its size limit."""

    def __init__(self, receive: Receive, deadline: float, limit: int, timeout: float) -> None:
        self._receive, self.deadline, self.limit, self.timeout = receive, deadline, limit, timeout
        self.size = 0
        self.complete = False

    async def receive(self) -> Message:
        if self.complete:
            return await self._receive()
        try:
            async with asyncio.timeout_at(self.deadline):  # (one already past fires at the first wait)
                message = await self._receive()
        except TimeoutError:
            raise Refusal(408, "body_timeout", f"the request body did not arrive within {self.timeout:g} s "
                          f"({self.size} bytes came)") from None
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                raise Refusal(413, "too_large", f"body exceeds the limit of {self.limit} bytes")
            self.complete = not message.get("more_body", False)
        return message


class BodyLimits:
    """Refuses a request body that is not complete ``timeout`` seconds after its head (408 ``body_timeout``) or
    that is (declared or streamed) larger than ``max_bytes()`` (413 ``too_large``); a response sent before its
    request's body was read closes the connection. ``respond`` renders a refusal answered here (the app's
    refusal handler, which counts it); a client gone before its body came is no error (``on_cut_off`` counts
    it; the endpoint's ``ClientDisconnect`` would be logged as an exception in the application)."""

    def __init__(self, app: ASGIApp, *, timeout: float, max_bytes: Callable[[], int],
                 respond: Callable[[Request, Exception], Response] = plain_refusal_response,
                 on_cut_off: Callable[[], None] | None = None) -> None:
        self.app, self.timeout, self.max_bytes, self.respond = app, timeout, max_bytes, respond
        self.on_cut_off = on_cut_off

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared in (None, "0") and "chunked" not in headers.get("transfer-encoding", "").lower():
            await self.app(scope, receive, send)  # no body: nothing to wait for
            return
        limit = self.max_bytes()
        if declared is not None and declared.isdigit() and int(declared) > limit:
            refusal = Refusal(413, "too_large", f"body of {declared} bytes exceeds the limit of {limit}")
            response = self.respond(Request(scope), refusal)
            response.headers["connection"] = "close"  # the body is never read: the connection cannot be reused
            await response(scope, receive, send)
            return
        body = _Body(receive, asyncio.get_running_loop().time() + self.timeout, limit, self.timeout)
        scope[BODY_CLOCK] = body

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and not body.complete:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, body.receive, send_closing)
        except ClientDisconnect:
            if body.complete:
                raise
            if self.on_cut_off is not None:  # the client left mid-body (a closed tab): nobody to answer
                self.on_cut_off()
