"""Result uploads as the relay takes them in (``Uploads``): a turn to read a body, and the worker threads that read
what arrived.

A thousand peers uploading within a second would each have their 585 KB body read into the relay's memory while
the reads queue (913 MB at k = 1,000 with copies, 3.8 times k = 5's). So at most ``UPLOADS`` bodies are read and in
hand at once; a waiting upload stays unread in its connection (uvicorn stops reading a body nobody asks for after
64 KB, the kernel holds the rest), and its ``--body-timeout`` counts from its turn (``limits.restart_body_clock``).
At most ``UPLOADS_PER_ADDRESS`` of the turns go to one address, so that one address's slow bodies (each may take the
body timeout to come) cannot hold them all: the others' uploads go on. An upload a merge waits for (in async mode,
the second copy of a result held for it, or a dispute's third result) takes the next free turn before the others
(``Turns``): behind a crowd's first results it had waited its place in a queue of hundreds, 10 s at 1,000 peers, and
every merge with it.

What arrived is read in a worker thread (decoding, norms, the result's part of the round's sum: O(n) each, which
would otherwise queue every other request behind them on the event loop); NumPy, hashlib and SQLite let go of the
GIL, so the reading overlaps the loop's work on another core. At most ``2 x READERS`` reads are in hand at once (a
read holds its decoded weights and sum terms until the loop takes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

READERS = min(4, os.cpu_count() or 1)  # worker threads that read results as they arrive
UPLOADS = 32  # result bodies read and in hand at once; the others wait unread
UPLOADS_PER_ADDRESS = 8  # of those, from one address

T = TypeVar("T")
R = TypeVar("R")


class Turns:
    """``count`` turns, handed out in order of asking, those asked for ``first`` before the others."""

    def __init__(self, count: int) -> None:
        self.free = count
        self.waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())

    async def acquire(self, *, first: bool = False) -> None:
        if self.free > 0 and not any(self.waiting):
            self.free -= 1
            return
        queue = self.waiting[0 if first else 1]
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # (handed this turn as it was cancelled: the next one takes it)
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(turn)
            raise

    def release(self) -> None:
        for queue in self.waiting:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self.free += 1


@dataclass
class Uploads:
    _readers: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _reading: asyncio.Semaphore | None = field(default=None, init=False, repr=False)
    _turns: Turns | None = field(default=None, init=False, repr=False)
    _by_address: dict[str, tuple[asyncio.Semaphore, list[int]]] = field(default_factory=dict, init=False, repr=False)

    @contextlib.asynccontextmanager
    async def turn(self, address: str, *, first: bool = False) -> AsyncIterator[None]:
        """Held while one upload from ``address`` is read and submitted (module docstring; ``first``: a merge waits
        for it)."""
        if self._turns is None:
            self._turns = Turns(UPLOADS)
        turns = self._turns
        gate, waiting = self._by_address.setdefault(address, (asyncio.Semaphore(UPLOADS_PER_ADDRESS), [0]))
        waiting[0] += 1
        try:
            async with gate:
                await turns.acquire(first=first)
                try:
                    yield
                finally:
                    turns.release()
        finally:
            waiting[0] -= 1
            if waiting[0] == 0:
                del self._by_address[address]

    async def read(self, read: Callable[[], T] | None, then: Callable[[T | None], R]) -> R:
        """``then(read())``, ``read`` in a worker thread (None: ``then(None)``) and ``then`` on the event loop, at most
        ``2 x READERS`` of them in hand at once."""
        if self._readers is None or self._reading is None:
            self._readers = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="result-reader")
            self._reading = asyncio.Semaphore(2 * READERS)
        readers = self._readers
        async with self._reading:
            done = None if read is None else await asyncio.get_running_loop().run_in_executor(readers, read)
            return then(done)

    def close(self) -> None:
        """Stop the worker threads (a read in progress is dropped); they start again at the next read."""
        if self._readers is not None:
            self._readers.shutdown(wait=False, cancel_futures=True)
            self._readers, self._reading = None, None
