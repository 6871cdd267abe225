"""How a peer's steps reach the relay: the steps are generators that yield what they need (sans IO), a transport
runs them.

A step (``server.harness.peer.relay_peer.RelayPeer``) yields a ``Request`` and gets back the ``httpx.Response``,
or has the ``httpx.TransportError`` raised where it yielded; it yields a ``Pause`` to wait. So the protocol is
written once and runs on either transport:

* ``SyncTransport``: an ``httpx.Client`` on the calling thread (``NativePeer`` in a thread of its own, the lock-step
  peers of ``bench attacks``); a pause waits on a ``threading.Event`` that a stop sets;
* ``AsyncTransport``: an ``httpx.AsyncClient`` on an event loop (``bench relay`` and ``bench load`` run hundreds of
  peers in one process); a pause waits on an ``asyncio.Event`` that a stop sets. ``run_async`` starts such a loop
  from synchronous code, in a thread of its own where the calling thread already runs one.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from server.relay.client import Call

T = TypeVar("T")
Send = Callable[[], httpx.Response]

# An idle pooled connection is dropped by the client after this, well before the relay's keep-alive timeout
# (``serve --timeout-keep-alive``, 5 s by default) closes it: a request sent on a connection the server is closing at
# that moment fails with ReadError, and a peer that paused a Retry-After of about 5 s met exactly that under load.
KEEPALIVE_EXPIRY_S = 2.0


def pooled(connections: int) -> httpx.Limits:
    """An HTTP client's pool for ``connections`` peers' requests at once, each kept alive ``KEEPALIVE_EXPIRY_S``."""
    return httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                        keepalive_expiry=KEEPALIVE_EXPIRY_S)


@dataclass(frozen=True)
class Request:
    """One HTTP request of ``call`` with ``headers`` (the peer's credentials); ``wrap`` wraps its sending (the
    ``send_result`` hook: an upload gate, an in-flight count), on the synchronous transport only."""

    call: Call
    headers: dict[str, str]
    wrap: Callable[[Send], httpx.Response] | None = None


@dataclass(frozen=True)
class Pause:
    seconds: float


Effect = Request | Pause
Steps = Generator[Effect, Any, T]  # a step: yields effects, is sent each Request's response, returns its outcome


class SyncTransport:
    """Runs steps on this thread over ``http`` (whose base URL is the relay's); ``stop`` ends a pause early."""

    def __init__(self, http: httpx.Client, stop: threading.Event | None = None) -> None:
        self.http, self.stop = http, stop or threading.Event()

    def run(self, steps: Steps[T]) -> T:
        answer: httpx.Response | None = None
        failed: httpx.TransportError | None = None
        while True:
            try:
                effect = steps.throw(failed) if failed is not None else steps.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            answer, failed = None, None
            if isinstance(effect, Pause):
                self.stop.wait(max(0.0, effect.seconds))
                continue
            try:
                answer = effect.wrap(functools.partial(self.send, effect)) if effect.wrap is not None else \
                    self.send(effect)
            except httpx.TransportError as error:
                failed = error

    def send(self, request: Request) -> httpx.Response:
        call = request.call
        return self.http.request(call.method, call.path, headers=request.headers, json=call.json,
                                 content=call.content, follow_redirects=call.follow_redirects)

    def close(self) -> None:
        self.http.close()


class AsyncTransport:
    """Runs steps on the running event loop over ``http`` (one pool many peers share); ``stop`` ends a pause early."""

    def __init__(self, http: httpx.AsyncClient, stop: asyncio.Event | None = None) -> None:
        self.http, self.stop = http, stop or asyncio.Event()

    async def run(self, steps: Steps[T]) -> T:
        answer: httpx.Response | None = None
        failed: httpx.TransportError | None = None
        while True:
            try:
                effect = steps.throw(failed) if failed is not None else steps.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            answer, failed = None, None
            if isinstance(effect, Pause):
                await self.pause(effect.seconds)
                continue
            if effect.wrap is not None:
                raise TypeError("a send_result hook wraps a synchronous send: run this peer on a SyncTransport")
            call = effect.call
            try:
                answer = await self.http.request(call.method, call.path, headers=effect.headers, json=call.json,
                                                 content=call.content, follow_redirects=call.follow_redirects)
            except httpx.TransportError as error:
                failed = error

    async def pause(self, seconds: float) -> None:
        if self.stop.is_set() or seconds <= 0:
            return
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
        except TimeoutError:
            pass


def run_async[R](make: Callable[[], Coroutine[Any, Any, R]]) -> R:
    """``asyncio.run`` of the coroutine ``make()`` builds, in a thread of its own when this thread already runs an
    event loop (a caller's, or Playwright's sync API, which keeps one marked running in the test session's thread
    once a browser test has run, so a plain ``asyncio.run`` there raises)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
