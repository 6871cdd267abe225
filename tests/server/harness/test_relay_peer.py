"""The one Python peer (``server.harness.peer``) without a relay: its steps are generators of requests, so a test
answers them from a script and reads what the peer did next (the reaction to each refusal is
``runtime.protocol.action_after``'s); both transports run the same steps over httpx's mock transport; the shared
trainer keeps the results its ``Retention`` says."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from runtime import wire
from runtime.protocol import Job, PeerAction, Wait
from runtime.weights import WeightSpec
from server.harness.peer import (
    AsyncTransport,
    Fetched,
    PeerHooks,
    Refused,
    RelayPeer,
    Request,
    Result,
    Retention,
    RetryPolicy,
    Steps,
    SyncTransport,
    Trainer,
    Unanswered,
    WeightsFrom,
    run_async,
)
from server.session.package import Package

DIGEST = "d" * 64
JOB = Job(round=0, slot=1, pass_index=0, unit_index=2, unit_seed=7, kind="data", episodes=0, progress=0.0,
          lease_deadline=100.0, lease_seconds=60.0, weights_round=0, num_rounds=2, fingerprint="f" * 16,
          weights_digest=DIGEST, weights_url=f"/api/weights/{DIGEST}")
JOINED = {"peer_id": "p1", "token": "t1"}
Answer = tuple[int, Any] | tuple[int, Any, dict[str, str]]  # (status, JSON or bytes[, headers])


def refusal(status: int, code: str) -> tuple[int, dict[str, str]]:
    return status, {"error": code, "message": code}


def response(answer: Answer) -> httpx.Response:
    status, body, *headers = answer
    if isinstance(body, bytes):
        return httpx.Response(status, content=body, headers=headers[0] if headers else None)
    return httpx.Response(status, json=body, headers=headers[0] if headers else None)


class Script:
    """Answers a peer's requests in order (each request must be the one the script expects) and notes its pauses."""

    def __init__(self, *exchanges: tuple[str, Answer]) -> None:
        self.exchanges = list(exchanges)
        self.pauses: list[float] = []
        self.sent: list[str] = []

    def run[T](self, steps: Steps[T]) -> T:
        answer: httpx.Response | None = None
        while True:
            try:
                effect = steps.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if not isinstance(effect, Request):
                self.pauses.append(effect.seconds)
                answer = None
                continue
            expected, reply = self.exchanges.pop(0)
            sent = f"{effect.call.method} {effect.call.path}"
            assert sent == expected, (sent, expected)
            self.sent.append(sent)
            answer = response(reply)


def free_rider() -> PeerHooks:
    """A peer that uploads the weights it was given (no runtime, no unit)."""
    return PeerHooks(train=lambda job, weights: weights)


def test_a_session_joins_through_a_429_trains_and_ends_when_the_relay_says_done() -> None:
    peer = RelayPeer(hooks=free_rider())
    script = Script(("POST /api/join", (*refusal(429, "join_rate"), {"Retry-After": "3"})),
                    ("POST /api/join", (200, JOINED)),
                    ("POST /api/work", (200, {"wait": 5.0, "reason": "the round is full"})),
                    ("POST /api/work", (200, JOB.to_json())),
                    (f"GET /api/weights/{DIGEST}", (200, b"weights")),
                    ("POST /api/result?round=0&slot=1", (200, {"accepted": True, "round": 0, "slot": 1})),
                    ("POST /api/work", (200, JOB.to_json())),  # (the same weights: not fetched again)
                    ("POST /api/result?round=0&slot=1", (*refusal(409, "duplicate"),)),
                    ("POST /api/work", (200, {"done": True, "reason": "all rounds merged"})))
    assert script.run(peer.session()) == "done" and not script.exchanges
    assert script.pauses == [1.0, 0.2]  # Retry-After capped at 1 s (a page's join wait); the Wait at wait_cap_s
    assert peer.log.join_waits == 1 and peer.log.accepted == [(0, 1)] and peer.log.weights_bytes == len(b"weights")
    assert peer.log.results == {"accepted": 1, "409 duplicate": 1} and peer.log.uploads_skipped_training == 2
    assert peer.log.refusals == [(429, "join_rate"), (409, "duplicate")] and peer.peer_id == "p1"


def test_a_401_joins_again_and_a_ban_ends_the_peer_without_an_error() -> None:
    peer = RelayPeer(hooks=free_rider())
    script = Script(("POST /api/join", (200, JOINED)),
                    ("POST /api/work", refusal(401, "unauthorized")),
                    ("POST /api/join", (200, {"peer_id": "p2", "token": "t2"})),
                    ("POST /api/work", (200, JOB.to_json())),
                    (f"GET /api/weights/{DIGEST}", (200, b"weights")),
                    ("POST /api/result?round=0&slot=1", refusal(403, "banned")))
    assert script.run(peer.session()) == "banned" and not script.exchanges  # no request after the ban
    assert peer.log.rejoins == 1 and peer.peer_id == "p2" and peer.stopping()
    assert peer.stopped is not None and peer.stopped.action is PeerAction.STOP


def test_weights_the_relay_no_longer_serves_are_fetched_again_for_the_next_job() -> None:
    peer = RelayPeer(hooks=free_rider())
    script = Script(("POST /api/join", (200, JOINED)),
                    ("POST /api/work", (200, JOB.to_json())),
                    (f"GET /api/weights/{DIGEST}", (200, b"weights")),
                    ("POST /api/result?round=0&slot=1", refusal(409, "wrong_base")),  # (refetch: forget them)
                    ("POST /api/work", (200, JOB.to_json())),
                    (f"GET /api/weights/{DIGEST}", refusal(404, "unknown_weights")),
                    ("POST /api/work", (200, JOB.to_json())),
                    (f"GET /api/weights/{DIGEST}", (200, b"weights")),
                    ("POST /api/result?round=0&slot=1", (200, {"accepted": True, "round": 0, "slot": 1})),
                    ("POST /api/work", (200, {"done": True, "reason": "done"})))
    assert script.run(peer.session()) == "done" and not script.exchanges


def test_the_weights_a_job_names_come_by_round_or_as_the_current_ones_where_asked() -> None:
    for weights_from, path in ((WeightsFrom.ROUND, "GET /api/weights?round=0"), (WeightsFrom.CURRENT, None)):
        peer = RelayPeer(weights_from=weights_from)
        message = wire.encode(np.zeros(2, dtype=np.float32), wire.WireHeader(
            spec=WeightSpec(entries=(("w", (2,)),)), round=0, fingerprint="f" * 16, num_examples=0))
        script = Script((path or "GET /api/weights", (200, message)), ("GET /api/unit/2", (200, b"unit")))
        fetched = script.run(peer.fetch(JOB))
        assert fetched == Fetched(message, b"unit") and peer.held_round == 0
        assert script.run(peer.fetch(dataclasses.replace(JOB, kind="experience"))) == Fetched(message, None)


def test_a_request_without_an_answer_is_sent_again_then_given_up() -> None:
    attempts: list[str] = []

    def refused(request: httpx.Request) -> httpx.Response:
        attempts.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    peer = RelayPeer(retry=RetryPolicy(resend=2, first_delay_s=0.0, max_delay_s=0.0))
    transport = SyncTransport(httpx.Client(base_url="http://relay", transport=httpx.MockTransport(refused)))
    with pytest.raises(Unanswered, match="POST /api/join: ConnectError"):
        transport.run(peer.sign_in())
    assert attempts == ["/api/join"] * 3 and peer.log.unanswered == 1


def test_both_transports_run_the_same_steps_and_the_hooks_see_every_exchange() -> None:
    seen: list[tuple[str, int | None]] = []
    wrapped: list[Job] = []

    def relay(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/join":
            return httpx.Response(200, json=JOINED)
        if request.url.path == "/api/work":
            assert request.headers["authorization"] == "Bearer p1:t1"
            return httpx.Response(200, json={"wait": 0.0, "reason": "no unit now"})
        return httpx.Response(200, json={"accepted": True, "round": 0, "slot": 1})

    def hooks() -> PeerHooks:
        return PeerHooks(on_exchange=lambda e: seen.append((e.call.path, e.response and e.response.status_code)),
                         send_result=lambda job, send: (wrapped.append(job), send())[1])

    peer = RelayPeer(hooks=hooks())
    sync = SyncTransport(httpx.Client(base_url="http://relay", transport=httpx.MockTransport(relay)))
    assert sync.run(peer.ask()) == Wait(0.0, "no unit now")
    assert sync.run(peer.upload(JOB, Result(b"result"))).accepted and wrapped == [JOB]

    async def asynchronously() -> Any:
        async with httpx.AsyncClient(base_url="http://relay", transport=httpx.MockTransport(relay)) as http:
            transport = AsyncTransport(http)
            answer = await transport.run(RelayPeer(hooks=PeerHooks(on_exchange=hooks().on_exchange)).ask(hold=2))
            with pytest.raises(TypeError, match="synchronous"):  # an upload gate holds a thread, not a loop
                await transport.run(RelayPeer(hooks=hooks()).upload(JOB, Result(b"result")))
            return answer

    # run_async: after a browser test, Playwright's sync API leaves a loop marked running in this thread
    assert run_async(asynchronously) == Wait(0.0, "no unit now")
    assert seen == [("/api/join", 200), ("/api/work", 200), ("/api/result?round=0&slot=1", 200),
                    ("/api/join", 200), ("/api/work?hold=2", 200)]


def test_a_pause_ends_when_the_peer_is_stopped() -> None:
    stop = threading.Event()
    stop.set()
    transport = SyncTransport(httpx.Client(base_url="http://relay"), stop)
    peer = RelayPeer(stop=stop.is_set)
    assert peer.stopping()
    transport.run(peer.pause(60.0))  # (returns at once)
    assert transport.run(peer.session()) == "stopped"


def test_upload_hooks_replace_only_honest_results_and_see_them_first() -> None:
    order: list[str] = []
    hooks = PeerHooks(honest_result=lambda job, weights, honest: order.append(f"saw {honest!r} from {weights!r}"),
                      upload=lambda job, honest: order.append("replaced") or b"poisoned")
    peer = RelayPeer(hooks=hooks)
    result = peer.trained(JOB, Fetched(b"weights", b"unit"), b"honest")
    script = Script(("POST /api/result?round=0&slot=1", (200, {"accepted": True, "round": 0, "slot": 1})),
                    ("POST /api/result?round=0&slot=1", refusal(422, "update_outlier")))
    script.run(peer.upload(JOB, result))
    assert order == ["saw b'honest' from b'weights'", "replaced"] and peer.log.trained == 1
    answer = script.run(peer.upload(JOB, Result(b"given", honest=False)))  # (a train hook's bytes: not replaced)
    assert isinstance(answer, Refused) and answer.action is PeerAction.CONTINUE and order[-1] == "replaced"


def job_of(package: Package, round_index: int, unit: int, slot: int = 0) -> Job:
    return dataclasses.replace(JOB, round=round_index, slot=slot, unit_index=unit, weights_round=round_index,
                               fingerprint=package.fingerprint, weights_digest=None, weights_url=None)


def weights_of(package: Package, round_index: int) -> bytes:
    return wire.encode(package.initial_weights, wire.WireHeader(spec=package.spec, round=round_index,
                                                                fingerprint=package.fingerprint, num_examples=0))


@pytest.mark.parametrize("keep, kept", [(Retention(), 3), (Retention(rounds=1), 1),
                                        (Retention(first_round_only=True), 2)])
def test_the_trainer_trains_a_unit_once_and_keeps_what_its_retention_says(package: Package, keep: Retention,
                                                                          kept: int) -> None:
    trainer = Trainer(package.task_description(), keep=keep)
    train: Callable[[Job, bytes], bytes] = lambda job, message: trainer.train(  # noqa: E731
        job, message, package.chunk_bytes(job.unit_index))
    try:
        first = train(job_of(package, 0, 0), weights_of(package, 0))
        assert train(job_of(package, 0, 0), weights_of(package, 0)) == first and trainer.reused == 1
        train(job_of(package, 0, 1, slot=1), weights_of(package, 0))
        train(job_of(package, 1, 2), weights_of(package, 1))
        assert trainer.trained == 3 and len(trainer.cache) == kept
        header, _ = wire.decode(first)
        assert (header.round, header.meta["slot"], header.meta["unit_index"]) == (0, 0, 0)
        stale = dataclasses.replace(job_of(package, 2, 3), weights_round=2)  # weights of round 1 for a job of round 2
        assert trainer.train_all([(stale, weights_of(package, 1), package.chunk_bytes(3))]) == [None]
    finally:
        trainer.close()
