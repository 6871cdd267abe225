"""A home connection in front of the relay: a TCP proxy on 127.0.0.1 that gives one client a link of a given
speed (``LinkSpec``: upload and download rates and a one-way delay), for ``peertrain bench comm --network``.

Why a proxy and not DevTools' ``Network.emulateNetworkConditions``: the emulation set on a page does reach its
dedicated worker's fetches (checked: with 800 ms of latency set on the page, a fetch from the worker took 0.88 s),
but it delays and throttles each request on its own; a home link is one queue per direction that every request and
the event stream share, which is what a proxy per peer models. The page, its scripts, Pyodide and the worker's
requests all cross it.

Each direction is one pipe shared by the link's connections, as an access link is: a chunk read from one side leaves
the pipe when the bytes ahead of it and itself have been serialized at the pipe's rate, and arrives ``delay`` later
(so a request and its answer cost one round trip plus their bytes at each rate). A connection's chunks stay in
order; a pipe holds at most ``QUEUE_CHUNKS`` chunks per connection before it stops reading (the sender's TCP
window then fills, as behind a slow link). Not modelled: loss, TCP's slow start (the proxy's loopback sockets
have none to speak of) and the connect round trip.

Bounded: it listens on 127.0.0.1 only, forwards to one address given by the caller (the relay, on this machine),
stops when closed, and closes itself after ``lifetime_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field

CHUNK_BYTES = 16 * 1024
QUEUE_CHUNKS = 32
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class LinkSpec:
    """A link's upload and download rates (Mbit/s) and one-way delay (ms)."""

    up_mbit: float
    down_mbit: float
    delay_ms: float

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        """``UP/DOWN/DELAY``, e.g. ``10/50/20``: 10 Mbit/s up, 50 down, 20 ms one way."""
        try:
            up, down, delay = (float(part) for part in text.split("/"))
        except ValueError as error:
            raise ValueError(f"a link is UP/DOWN/DELAY in Mbit/s, Mbit/s and ms (e.g. 10/50/20), got {text!r}") \
                from error
        if not (up > 0 and down > 0 and delay >= 0):
            raise ValueError(f"a link's rates must be above 0 and its delay 0 or more, got {text!r}")
        return cls(up, down, delay)

    def __str__(self) -> str:
        return f"{self.up_mbit:g}/{self.down_mbit:g} Mbit/s, {self.delay_ms:g} ms one way"


@dataclass
class Pipe:
    """One direction of a link: when it is next free, and what crossed it."""

    bits_per_second: float
    delay_s: float
    free_at: float = 0.0
    bytes: int = 0

    def arrival(self, now: float, size: int) -> float:
        start = max(now, self.free_at)
        self.free_at = start + size * 8 / self.bits_per_second
        self.bytes += size
        return self.free_at + self.delay_s


@dataclass
class ShapedLink:
    """A proxy listening on 127.0.0.1 (a port of its own) in front of ``target``; ``url`` once started."""

    target: tuple[str, int]
    spec: LinkSpec
    lifetime_s: float = 3600.0
    up: Pipe = field(init=False)
    down: Pipe = field(init=False)
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None

    def __post_init__(self) -> None:
        if self.target[0] not in LOCAL_HOSTS:
            raise ValueError(f"a shaped link only forwards to this machine, not to {self.target[0]}")
        self.up = Pipe(self.spec.up_mbit * 1e6, self.spec.delay_ms / 1000)
        self.down = Pipe(self.spec.down_mbit * 1e6, self.spec.delay_ms / 1000)

    def start(self) -> ShapedLink:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
            loop.call_later(self.lifetime_s, loop.stop)
            ready.set()
            try:
                loop.run_forever()
            finally:
                self._server.close()
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(Exception):
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                    loop.run_until_complete(self._server.wait_closed())
                loop.close()

        self._thread = threading.Thread(target=serve, daemon=True, name=f"link-{self.spec}")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the shaped link did not start listening within 10 s")
        return self

    def close(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    async def _connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            relay_reader, relay_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(self._carry(client_reader, relay_writer, self.up),
                                 self._carry(relay_reader, client_writer, self.down), return_exceptions=True)
        finally:
            for writer in (relay_writer, client_writer):
                with contextlib.suppress(Exception):
                    writer.close()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pipe: Pipe) -> None:
        """Read chunks from one side and deliver each on the other at its arrival time on ``pipe``."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)

        async def deliver() -> None:
            while True:
                at, chunk = await queue.get()
                if not chunk:
                    break
                await asyncio.sleep(max(0.0, at - loop.time()))
                writer.write(chunk)
                await writer.drain()

        delivering = loop.create_task(deliver())
        try:
            while chunk := await reader.read(CHUNK_BYTES):
                await queue.put((pipe.arrival(loop.time(), len(chunk)), chunk))
            await queue.put((0.0, b""))
            await delivering
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            delivering.cancel()
            with contextlib.suppress(Exception):  # (a half close: the other direction may still carry an answer)
                writer.write_eof()
