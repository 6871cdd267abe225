"""What changes a peer's behaviour from outside: its hooks and its retry policy.

* ``upload(job, honest) -> bytes``: the bytes uploaded instead of an honest result (attackers);
* ``train(job, weights) -> bytes``: skip the unit and the training, upload these bytes;
* ``honest_result(job, weights, honest)``: sees each honest result as soon as it is trained, before the upload hook
  runs (colluding attackers: little_is_enough needs the others' honest updates of the round; a bench that trains a
  round's units in one batch shows them all before any upload);
* ``send_result(job, send) -> Response``: wraps each sending of an upload (a gate that holds uploads, an in-flight
  count; synchronous transport only);
* ``on_answer(response)``: sees every answer (tallies of 503 reasons); ``on_exchange(exchange)``: sees every
  request with its timing, answered or not (a load bench's latencies);
* ``stop() -> bool``: a stop condition, looked at before every step and every resend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from runtime.protocol import Job
from server.relay.client import Call


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of a request that got no answer (connection refused or dropped) or, with ``retry_5xx``, a 5xx:
    sent again up to ``resend`` times, then, up to ``restarts`` times, the loop starts over from asking for work
    (what the browser's worker does after an error), with a doubling delay between tries; past both the peer gives
    up (``Unanswered``)."""

    resend: int = 0  # times the same request is sent again
    restarts: int = 0  # times the loop then starts over from asking for work
    retry_5xx: bool = True
    first_delay_s: float = 0.05
    max_delay_s: float = 0.5

    def delay(self, tries: int) -> float:
        """The pause after the ``tries``-th failed try (counting from 0): doubling, at most ``max_delay_s``."""
        return min(self.first_delay_s * 2.0 ** min(tries, 60), self.max_delay_s)


@dataclass(frozen=True)
class Exchange:
    """One request and what came of it: ``started`` (``time.perf_counter()``), the seconds until the answer (or the
    failure), the response, or the transport error instead."""

    call: Call
    started: float
    seconds: float
    response: httpx.Response | None
    error: httpx.TransportError | None = None


@dataclass
class PeerHooks:
    upload: Callable[[Job, bytes], bytes] | None = None
    train: Callable[[Job, bytes], bytes] | None = None
    honest_result: Callable[[Job, bytes, bytes], None] | None = None
    send_result: Callable[[Job, Callable[[], httpx.Response]], httpx.Response] | None = None
    on_answer: Callable[[httpx.Response], None] | None = None
    on_exchange: Callable[[Exchange], None] | None = None
    stop: Callable[[], bool] | None = None
