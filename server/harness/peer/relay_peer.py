"""One peer of the relay: the browser worker's protocol (``web/src/worker.js``), written once for every Python peer.

``RelayPeer`` holds a peer's state (its credentials, the weights it holds, its runtime, its log) and its steps, each
a generator of requests (``server.harness.peer.transport``): ``sign_in`` (429: wait Retry-After, try again), ``ask``
(``POST /api/work`` read as ``runtime.protocol``'s Job, Wait or Done), ``fetch`` (the weights the job names, by
digest or as a chain of steps from those held, and the unit), ``train`` (here, on a shared ``Trainer``, or a hook),
``upload``, and ``session``, the whole loop. What the peer does after a refusal is ``runtime.protocol.action_after``:
stop (banned, an outdated runtime), join again (401), forget the weights held, wait Retry-After, or go on.

``NativePeer`` runs ``session`` in a thread; the benches drive the steps themselves where they measure (the lock-step
rounds of ``bench attacks`` and ``bench relay``, the crowd of ``bench load``), each step's outcome in hand.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import httpx

from runtime import wire
from runtime.deltas import is_chain
from runtime.peer import Peer
from runtime.protocol import (
    Done,
    Job,
    Joined,
    PeerAction,
    Receipt,
    Wait,
    WorkAnswer,
    action_after,
    work_answer_from_json,
)
from server.harness.peer.hooks import Exchange, PeerHooks, RetryPolicy
from server.harness.peer.outcomes import Fetched, PeerLog, Refused, Result, Unanswered, retry_after
from server.harness.peer.trainer import Trainer
from server.harness.peer.transport import Pause, Request, Send, Steps
from server.relay.client import (
    Call,
    Credentials,
    RelayRefusal,
    join_call,
    named_weights_call,
    result_call,
    task_call,
    unit_call,
    weights_call,
    work_call,
)

Wrap = Callable[[Send], httpx.Response]
RETRY_AFTER_CAP_S = 1.0  # the longest wait a Retry-After gets by default (a join refused 429 waits 1 s, as a page)


class WeightsFrom(StrEnum):
    """Which URL a peer fetches a job's weights from."""

    DIGEST = "digest"  # GET /api/weights/{weights_digest}[/from/{held}], as a page (a job naming none: by round)
    ROUND = "round"  # GET /api/weights?round={weights_round}
    CURRENT = "current"  # GET /api/weights: the relay's current weights, whatever the job names


class RelayPeer:
    """One peer's state and protocol steps (see the module's text). Collaborators: ``hooks``, ``retry`` (requests that
    got no answer), ``trainer`` (a shared ``Trainer``; None: the peer builds its own ``runtime.peer.Peer`` from
    ``GET /api/task``, as a page does, and rebuilds chains of steps); options: ``weights_from``, ``reuse_weights``
    (False: fetch the weights for every job), ``hold_s`` (``session``'s asks), ``wait_cap_s`` (the longest wait a
    ``Wait`` gets), ``retry_after_cap_s``, ``join_tries`` (None: until the deadline), ``stop`` (a stop condition
    besides the hook's), ``deadline`` (monotonic), ``engine_class`` (what the peer tells the relay it trains on when
    it joins, ``runtime.peer.engine_class``; empty: nothing, the relay learns it from the first result)."""

    def __init__(self, *, hooks: PeerHooks | None = None, retry: RetryPolicy | None = None,
                 trainer: Trainer | None = None, weights_from: WeightsFrom = WeightsFrom.DIGEST,
                 reuse_weights: bool = True, hold_s: float | None = None, wait_cap_s: float = 0.2,
                 retry_after_cap_s: float = RETRY_AFTER_CAP_S, join_tries: int | None = None,
                 join_code: str | None = None, stop: Callable[[], bool] | None = None,
                 deadline: float = math.inf, engine_class: str = "") -> None:
        self.hooks, self.retry, self.trainer = hooks or PeerHooks(), retry or RetryPolicy(), trainer
        self.weights_from, self.reuse_weights = weights_from, reuse_weights
        self.hold_s, self.wait_cap_s, self.retry_after_cap_s = hold_s, wait_cap_s, retry_after_cap_s
        self.join_tries, self.join_code, self.stop, self.deadline = join_tries, join_code, stop, deadline
        self.engine_class = engine_class
        self.credentials: Credentials | None = None
        self.runtime: Peer | None = None  # the peer's own runtime (None with a shared trainer or a train hook)
        self.log = PeerLog()
        self.weights_message = b""
        self.held_round: int | None = None  # the round of the weights held
        self._held: object = None  # what names the weights held (a digest, a round, or (round, digest))
        self.stopped: Refused | None = None  # the refusal after which the protocol says stop

    @property
    def peer_id(self) -> str | None:
        return self.credentials.peer_id if self.credentials else None

    def stopping(self) -> bool:
        return self.stopped is not None or (self.stop is not None and self.stop()) or (
            self.hooks.stop is not None and self.hooks.stop())

    # -- requests --------------------------------------------------------------------------------------------
    def pause(self, seconds: float) -> Steps[None]:
        yield Pause(max(0.0, min(seconds, self.deadline - time.monotonic())))

    def request(self, call: Call, *, wrap: Wrap | None = None) -> Steps[httpx.Response]:
        """The answer to ``call``, sent again per the retry policy; raises ``Unanswered``."""
        headers = self.credentials.headers if call.authorized and self.credentials else {}
        problem = ""
        for tries in range(self.retry.resend + 1):
            started = time.perf_counter()
            try:
                response = yield Request(call, headers, wrap)
            except httpx.TransportError as error:
                self.observe(Exchange(call, started, time.perf_counter() - started, None, error))
                problem = f"{type(error).__name__}: {error}"
            else:
                self.observe(Exchange(call, started, time.perf_counter() - started, response))
                if response.status_code < 500 or not self.retry.retry_5xx:
                    return response  # type: ignore[no-any-return]
                problem = f"HTTP {response.status_code}"
            delay = self.retry.delay(tries)
            if tries == self.retry.resend or self.stopping() or time.monotonic() + delay > self.deadline:
                break
            yield from self.pause(delay)
        self.log.unanswered += 1
        raise Unanswered(f"{call.method} {call.path}: {problem}")

    def observe(self, exchange: Exchange) -> None:
        if self.hooks.on_exchange is not None:
            self.hooks.on_exchange(exchange)
        if exchange.response is not None and self.hooks.on_answer is not None:
            self.hooks.on_answer(exchange.response)

    def call(self, call: Call, *, wrap: Wrap | None = None) -> Steps[Any]:
        """``call``'s parsed answer, or the refusal (kept in the log, and reacted to: ``refused``)."""
        response = yield from self.request(call, wrap=wrap)
        try:
            return call.parse(response)
        except RelayRefusal as refusal:
            return self.refused(Refused(refusal.status, refusal.code, refusal.message,
                                        action_after(refusal.status, refusal.code), retry_after(response),
                                        refusal.ticket))

    def refused(self, refusal: Refused) -> Refused:
        """What a refusal changes in the peer: stop for good, join again, or forget the weights held."""
        self.log.refusals.append((refusal.status, refusal.code))
        if refusal.action is PeerAction.STOP:
            self.stopped = refusal
        elif refusal.action is PeerAction.REJOIN:
            self.credentials, self.log.rejoins = None, self.log.rejoins + 1
        elif refusal.action is PeerAction.REFETCH_WEIGHTS:
            self.weights_message, self._held = b"", None
        return refusal

    # -- the steps -------------------------------------------------------------------------------------------
    def sign_in(self) -> Steps[Joined | Refused]:
        """``POST /api/join``; a 429 (too many joins from this address) waits Retry-After and tries again, up to
        ``join_tries`` times, showing the ticket the refusal gave (it keeps this join's place in the address's
        queue)."""
        tries, ticket, asked = 0, "", time.monotonic()
        while True:
            answer = yield from self.call(join_call(self.join_code, ticket, self.engine_class))
            tries += 1
            if not isinstance(answer, Refused):
                joined = Joined.from_json(answer)
                self.credentials = Credentials(joined.peer_id, joined.token)
                self.log.join_seconds.append(time.monotonic() - asked)
                return joined
            if answer.action is not PeerAction.RETRY or (self.join_tries is not None and tries >= self.join_tries) \
                    or self.stopping() or time.monotonic() > self.deadline:
                return answer
            self.log.join_waits += 1
            ticket = answer.ticket or ticket  # (held, the place is kept: its Retry-After is the turn, not a guess)
            yield from self.pause(answer.retry_after if answer.ticket else min(answer.retry_after,
                                                                               self.retry_after_cap_s))

    def ask(self, hold: float | None = None) -> Steps[WorkAnswer | Refused]:
        """``POST /api/work[?hold=S]`` (joining first when the peer holds no token)."""
        if self.credentials is None:
            joined = yield from self.sign_in()
            if isinstance(joined, Refused):
                return joined
        answer = yield from self.call(work_call(hold))
        return answer if isinstance(answer, Refused) else work_answer_from_json(answer)

    def wait(self, answer: Wait) -> Steps[None]:
        """What a ``Wait`` says: ask again after its seconds (at most ``wait_cap_s``)."""
        yield from self.pause(min(answer.wait, self.wait_cap_s))

    def weights(self, job: Job) -> Steps[bytes | Refused]:
        """The weights message the job names, fetched when the one held is other weights. A peer with its own
        runtime asks for the chain of steps from the weights it holds (``runtime.deltas``): ``weights_message`` is
        then that chain; one that does not rebuild the named weights is dropped for the full message."""
        digest = job.weights_digest if self.weights_from is WeightsFrom.DIGEST else None
        wanted: object = (job.round, job.weights_digest) if self.weights_from is WeightsFrom.CURRENT else \
            digest or job.weights_round
        if self.reuse_weights and self._held == wanted and self.weights_message:
            return self.weights_message
        if digest is not None:
            held = self.runtime.weights_sha if self.runtime is not None else None
            message = yield from self.call(named_weights_call(digest, held))
        else:
            message = yield from self.call(weights_call(
                None if self.weights_from is WeightsFrom.CURRENT else job.weights_round))
        if isinstance(message, Refused):
            return message
        self.log.weights_bytes += len(message)
        if self.runtime is not None:
            try:
                self.runtime.set_weights(message)
                self.log.chains += is_chain(message)
            except wire.WireError:
                if digest is None or not is_chain(message):
                    raise
                message = yield from self.call(named_weights_call(digest))
                if isinstance(message, Refused):
                    return message
                self.log.weights_bytes += len(message)
                self.runtime.set_weights(message)
        self.held_round = wire.read_header(message).round if self.weights_from is WeightsFrom.CURRENT else \
            job.weights_round
        # (CURRENT: the round of the weights the relay gave, which an undo may have made other than the job's)
        self.weights_message = message
        self._held = (self.held_round, job.weights_digest) if self.weights_from is WeightsFrom.CURRENT else wanted
        return message

    def fetch(self, job: Job, *, unit: bool = True) -> Steps[Fetched | Refused]:
        """The job's weights and (``unit``, a data task) the unit's data."""
        weights = yield from self.weights(job)
        if isinstance(weights, Refused):
            return weights
        if not unit or job.kind != "data":
            return Fetched(weights, None)
        data = yield from self.call(unit_call(job.unit_index))
        return data if isinstance(data, Refused) else Fetched(weights, data)

    def prepare(self) -> Steps[None]:
        """The peer's own runtime, built from ``GET /api/task`` as a page builds it (where it trains itself)."""
        if self.runtime is None and self.trainer is None and self.hooks.train is None:
            info = yield from self.call(task_call())
            if isinstance(info, Refused):
                raise RelayRefusal(info.status, info.code, info.message)
            self.runtime = Peer(info)

    def train(self, job: Job, fetched: Fetched) -> Result:
        """The result of ``job``: the train hook's bytes, or trained on the shared trainer or the peer's runtime."""
        if self.hooks.train is not None:
            self.log.uploads_skipped_training += 1
            return Result(self.hooks.train(job, fetched.weights), honest=False)
        if self.trainer is not None:
            body = self.trainer.train(job, fetched.weights, fetched.unit)
        else:
            assert self.runtime is not None, "prepare() builds the runtime"
            body = self.runtime.train(job, fetched.unit)
        return self.trained(job, fetched, body)

    def trained(self, job: Job, fetched: Fetched, body: bytes) -> Result:
        """``body``, trained honestly for ``job`` (here, or by a bench for a batch of peers): counted, and shown to the
        ``honest_result`` hook (colluding attackers see each other's honest results before any upload)."""
        self.log.trained += 1
        if self.hooks.honest_result is not None:
            self.hooks.honest_result(job, fetched.weights, body)
        return Result(body)

    def upload(self, job: Job, result: Result) -> Steps[Receipt | Refused]:
        """``POST /api/result`` of ``result`` (an honest one through the upload hook), each sending through the
        ``send_result`` hook."""
        body = self.hooks.upload(job, result.body) if result.honest and self.hooks.upload else result.body
        send_result = self.hooks.send_result
        wrap = (lambda send: send_result(job, send)) if send_result is not None else None
        answer = yield from self.call(result_call(job.round, job.slot, body), wrap=wrap)
        if isinstance(answer, Refused):
            self.log.results[f"{answer.status} {answer.code}"] += 1
            return answer
        self.log.results["accepted"] += 1
        self.log.accepted.append((job.round, job.slot))
        return Receipt.from_json(answer)

    # -- the loop ------------------------------------------------------------------------------------------
    def session(self, max_steps: int = 100_000) -> Steps[str]:
        """Until the relay says the session is done (returns "done"), a stop condition holds ("stopped") or a refusal
        says stop (its code, as "banned"). Raises TimeoutError past ``max_steps`` or the deadline, ``Unanswered`` when
        the retry policy gave up, ``RelayRefusal`` when joining is refused for good."""
        restarts = 0  # since the last step that went through
        for _ in range(max_steps):
            if self.stopping():
                return self.stopped.code if self.stopped is not None else "stopped"
            if time.monotonic() > self.deadline:
                break
            try:
                ended = yield from self.step()
            except Unanswered:
                if restarts >= self.retry.restarts or self.stopping():
                    raise
                yield from self.pause(self.retry.delay(restarts))
                restarts += 1
                continue
            restarts = 0  # (a step went through: the delays start over)
            if ended is not None:
                return ended
        raise TimeoutError(f"the session was not done after {max_steps} steps or at the peer's deadline")

    def step(self) -> Steps[str | None]:
        """One ``work -> weights -> unit -> train -> result``; "done" when the relay says the session is done, a
        refusal's code when it says stop, else None."""
        if self.credentials is None:
            joined = yield from self.sign_in()
            if isinstance(joined, Refused):
                if joined.action is PeerAction.RETRY:
                    return None  # (stopping, or past the deadline: the loop says which)
                raise RelayRefusal(joined.status, joined.code, joined.message)  # joining was refused for good
        yield from self.prepare()
        answer = yield from self.ask(self.hold_s)
        if isinstance(answer, Done):
            return "done"
        if isinstance(answer, Wait):
            yield from self.wait(answer)
            return None
        if isinstance(answer, Refused):
            if answer.action is PeerAction.CONTINUE:  # (a request the relay will refuse again: not in a hot loop)
                yield from self.pause(self.wait_cap_s)
            return (yield from self.after(answer))
        fetched = yield from self.fetch(answer, unit=self.hooks.train is None)
        if isinstance(fetched, Refused):  # the lease went meanwhile, or weights no longer kept: ask again
            return (yield from self.after(fetched))
        receipt = yield from self.upload(answer, self.train(answer, fetched))
        return (yield from self.after(receipt)) if isinstance(receipt, Refused) else None

    def after(self, refusal: Refused) -> Steps[str | None]:
        """The loop after a refusal: its code where the protocol says stop; a wait where it says retry."""
        if refusal.action is PeerAction.STOP:
            return refusal.code
        if refusal.action is PeerAction.RETRY:
            yield from self.pause(min(refusal.retry_after, self.retry_after_cap_s))
        return None
