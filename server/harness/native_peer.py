"""A native peer: the browser worker's loop (``web/src/worker.js``) in Python, in a thread, for benches and tests.

It runs ``RelayPeer.session`` (``server.harness.peer``: the protocol's steps, written once for every Python peer) on
a ``SyncTransport`` over its own ``httpx.Client``, and trains with ``runtime.peer.Peer``, the module a browser's
worker runs: join, then ``work -> weights -> unit -> train -> result`` until the relay says the session is done, at
most ``max_steps`` requests for work and ``timeout_s`` seconds (past either, ``error`` is a TimeoutError). A refusal
is met as ``runtime.protocol.action_after`` says: a ban ends the peer (``ended`` is "banned"), a 401 joins again, a
429 or 503 waits. ``PeerHooks`` change what it does (attackers, gates, tallies, stop conditions); ``RetryPolicy``
says what a request that got no answer or a 5xx does.
"""

from __future__ import annotations

import ssl
import threading
import time

import httpx

from runtime.peer import Peer, engine_class
from runtime.protocol import Job
from server.harness.peer import (
    PeerHooks,
    PeerLog,
    RelayPeer,
    RetryPolicy,
    SyncTransport,
    Unanswered,
)

__all__ = ["Job", "NativePeer", "PeerHooks", "PeerLog", "RetryPolicy", "Unanswered"]


class NativePeer:
    """One native peer of the relay at ``url``; ``run()`` in this thread, or ``start()`` in a thread of its own."""

    def __init__(self, url: str, *, hooks: PeerHooks | None = None, retry: RetryPolicy | None = None,
                 hold_s: float | None = None, wait_cap_s: float = 0.2, max_steps: int = 100_000,
                 timeout_s: float = 600.0, deadline: float | None = None, request_timeout_s: float = 30.0,
                 join_code: str | None = None, headers: dict[str, str] | None = None,
                 stop: threading.Event | None = None, verify: ssl.SSLContext | bool = True) -> None:
        self.hooks = hooks or PeerHooks()
        self.stop_event = stop or threading.Event()
        self.max_steps = max_steps
        self.transport = SyncTransport(httpx.Client(base_url=url, timeout=request_timeout_s, headers=headers,
                                                    verify=verify), self.stop_event)
        self.protocol = RelayPeer(hooks=self.hooks, retry=retry, hold_s=hold_s, wait_cap_s=wait_cap_s,
                                  join_code=join_code, stop=self.stop_event.is_set,
                                  deadline=deadline if deadline is not None else time.monotonic() + timeout_s,
                                  engine_class="" if self.hooks.train is not None else engine_class())
        self.ended = ""  # "done", "stopped", a refusal's code after which the protocol says stop, or "timeout"
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    @property
    def log(self) -> PeerLog:
        return self.protocol.log

    @property
    def peer(self) -> Peer | None:
        """The runtime it trains with (None before the first step, or when a hook trains)."""
        return self.protocol.runtime

    @property
    def peer_id(self) -> str | None:
        return self.protocol.peer_id

    # -- threads -----------------------------------------------------------------------------------
    def start(self) -> NativePeer:
        self.thread = threading.Thread(target=self.run_catching, daemon=True)
        self.thread.start()
        return self

    def run_catching(self) -> None:
        try:
            self.run()
        except BaseException as error:  # reported by the caller (``error``)
            self.error = error
        finally:
            self.close()

    def close(self) -> None:
        self.transport.close()

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> str:
        """Until the session is done, a stop condition holds or a refusal says stop; returns ``ended``. Raises
        TimeoutError past the step or time bound, ``Unanswered`` when the retry policy gave up."""
        try:
            self.ended = self.transport.run(self.protocol.session(self.max_steps))
        except TimeoutError:
            self.ended = "timeout"
            raise
        return self.ended
