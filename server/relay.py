"""The relay: hands out work, checks every result, merges, validates and checkpoints (via ``Session``).

HTTP API (JSON unless noted; weights, chunks and results are binary wire messages):

    GET  /api/session              what the session trains, peers, round progress, refusals (public)
    GET  /api/task                 what a peer needs to build the task (import name, settings, assets, spec)
    GET  /api/events               server-sent events: the session status after every change
    POST /api/join                 {"join_code"?} -> {"peer_id", "token"}
    POST /api/work[?hold=S]        (peer) -> an assignment with a lease deadline, or {"wait": s, "reason"};
                                   with hold, a "wait" answer is held up to S s (at most MAX_HOLD_SECONDS and
                                   half the peer timeout) and work is answered the moment it exists
    GET  /api/weights              (peer) the global weights of the current round
    GET  /api/unit/{index}         (peer, holding a lease on it) the unit's data chunk
    POST /api/result?round=&slot=  (peer) a result message; refused with 4xx and a reason, counted
    POST /api/admin/{pause,resume,stop}, GET /api/admin/export/{model,history}   (admin token)
    POST /api/admin/session        (admin token) a new session on the same package; see ``server.admin``

Peers authenticate with ``Authorization: Bearer <peer_id>:<token>``, admins with ``Bearer <admin token>``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import io
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime import wire
from runtime.tasks import UnitResult
from server.package import Package
from server.session import Session
from server.store import Store, StoredResult

MAX_HOLD_SECONDS = 20.0  # longest a POST /api/work?hold=S request is held
HANDOUT_TURNS = 3  # event-loop turns given to woken held requests after a merge (each answers in one or two)


@dataclass(kw_only=True)
class RelayOptions:
    admin_token: str
    join_code: str | None = None
    lease_seconds: float = 120.0  # a unit not returned by then is handed to someone else
    peer_timeout: float = 30.0  # a peer not heard from for this long no longer counts as connected
    min_peers: int | None = None  # peers needed before a round starts (default: k)
    max_update_norm: float = 1e4  # L2 norm of (result - global) above which a result is refused
    retry_seconds: float = 1.0  # what a waiting peer is told (one that did not hold its request)


class Refusal(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Relay:
    session: Session
    package: Package
    store: Store
    options: RelayOptions
    paused: bool = False
    version: int = 0
    merging: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _work_event: asyncio.Event = field(default_factory=asyncio.Event)
    _merge_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _weights_cache: tuple[int, bytes] | None = None
    # (round, slot) -> the accepted result (message dropped) and its decoded weights, until the round merges
    _decoded: dict[tuple[int, int], tuple[StoredResult, np.ndarray]] = field(default_factory=dict)
    latest_samples: list[dict[str, Any]] = field(default_factory=list)
    samples_round: int | None = None  # rounds merged into the weights latest_samples come from
    _background: set[asyncio.Task[None]] = field(default_factory=set)  # the loop keeps only weak references

    def __post_init__(self) -> None:
        released = self.store.release_live_leases()
        if released:
            self.store.count("leases_released_on_start", released)

    # -- state the page and the CLI see ---------------------------------------------------------
    @property
    def min_peers(self) -> int:
        return self.options.min_peers or min(self.session.plan.participants_per_round, self.session.plan.num_units)

    def status(self) -> dict[str, Any]:
        session = self.session
        active = self.store.active_peers(self.options.peer_timeout)
        slots = [] if session.done else session.assignments()
        results = self.store.result_slots(session.round) if not session.done else set()
        leases = self.store.leases(session.round) if not session.done else {}
        now = time.time()
        return {
            **session.describe(),
            "task": session.task.describe(),
            "fingerprint": self.package.fingerprint,
            "paused": self.paused,
            "merging": self.merging,
            "peers": {"connected": len(active), "joined": self.store.peer_count(), "needed": self.min_peers},
            "round_progress": {"slots": len(slots), "done": len(results),
                               "leased": sum(1 for s, lease in leases.items() if s not in results
                                             and lease.deadline >= now)},
            "history": session.history[-200:],
            "initial_metrics": session.initial_metrics,
            "samples": self.latest_samples,
            "samples_round": self.samples_round,
            "counters": self.store.counters(),
            "version": self.version,
        }

    def start_session(self, session: Session, store: Store) -> None:
        """Serve ``session`` (with its own store) from now on, forgetting what belonged to the previous one."""
        self.session, self.store = session, store
        self.paused = False
        self.latest_samples, self.samples_round = [], None
        self._weights_cache = None  # (the caller announces the change: this may run in a worker thread)
        self._decoded = {}

    def changed(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def work_changed(self) -> None:
        """Something that can turn a "wait" into work happened (a round opened, a peer joined, an admin
        action): wake the peers holding ``POST /api/work?hold=S``. Lease expiry wakes nobody; holders see it
        when their hold ends."""
        self._work_event.set()
        self._work_event = asyncio.Event()
        self.changed()

    async def hold_for_work(self, seconds: float) -> None:
        """Return after ``work_changed`` or ``seconds``, whichever comes first."""
        try:
            await asyncio.wait_for(self._work_event.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            pass

    # -- handing out work -----------------------------------------------------------------------
    def next_assignment(self, peer_id: str) -> dict[str, Any]:
        session = self.session
        if session.done:
            return {"done": True, "reason": session.stopped or "the session is complete"}
        if self.paused or self.merging:
            return {"wait": self.options.retry_seconds, "reason": "paused" if self.paused else "merging the round"}
        results, leases = self.store.result_slots(session.round), self.store.leases(session.round)
        now = time.time()
        started = bool(results) or bool(leases)
        connected = len(self.store.active_peers(self.options.peer_timeout))
        if not started and connected < self.min_peers:
            missing = self.min_peers - connected
            return {"wait": self.options.retry_seconds,
                    "reason": f"waiting for {missing} more peer{'s' if missing > 1 else ''} to start round "
                              f"{session.round + 1} ({connected}/{self.min_peers} connected)"}
        open_slots = []
        for assignment in session.assignments():
            if assignment.slot in results:
                continue
            lease = leases.get(assignment.slot)
            if lease is not None and lease.deadline >= now:
                if lease.peer_id == peer_id:
                    return self._assignment_json(assignment, lease.deadline)
                continue
            open_slots.append((assignment, lease))
        if not open_slots:
            return {"wait": self.options.retry_seconds,
                    "reason": f"round {session.round + 1}: waiting for other peers' units"}
        assignment, expired = open_slots[0]
        if expired is not None:
            self.store.count("leases_expired")
        lease = self.store.grant(session.round, assignment.slot, assignment.unit_index, peer_id,
                                 self.options.lease_seconds)
        self.changed()
        return self._assignment_json(assignment, lease.deadline)

    def _assignment_json(self, assignment: Any, deadline: float) -> dict[str, Any]:
        unit = self.session.work_unit(assignment)
        return {**assignment.to_json(), "kind": self.session.task.kind, "episodes": unit.episodes,
                "progress": unit.progress,
                "lease_deadline": deadline, "lease_seconds": max(0.0, deadline - time.time()),
                "weights_round": self.session.round, "num_rounds": self.session.num_rounds,
                "fingerprint": self.package.fingerprint}

    def weights_message(self) -> bytes:
        if self._weights_cache is None or self._weights_cache[0] != self.session.round:
            header = wire.WireHeader(spec=self.session.spec, round=self.session.round,
                                     fingerprint=self.package.fingerprint, num_examples=0)
            self._weights_cache = (self.session.round, wire.encode(self.session.weights, header))
        return self._weights_cache[1]

    # -- checking and merging results -----------------------------------------------------------
    def accept_result(self, peer_id: str, round_index: int, slot: int, body: bytes) -> StoredResult:
        """Check and store a result, keeping its decoded weights for the merge (saves reading them back)."""
        stored, vector = self.check_result(peer_id, round_index, slot, body)
        self.store.add_result(stored)
        self._decoded[(round_index, slot)] = (dataclasses.replace(stored, message=b""), vector)
        return stored

    def check_result(self, peer_id: str, round_index: int, slot: int,
                     body: bytes) -> tuple[StoredResult, np.ndarray]:
        """The result as it would be stored, and its decoded weights; a ``Refusal`` names what is wrong."""
        session = self.session
        if session.done or round_index != session.round:
            raise Refusal(409, "stale_round", f"round {round_index} is not the current round ({session.round})")
        by_slot = {a.slot: a for a in session.assignments()}
        if slot not in by_slot:
            raise Refusal(404, "unknown_slot", f"round {round_index} has no slot {slot}")
        if slot in self.store.result_slots(round_index):
            raise Refusal(409, "duplicate", f"slot {slot} of round {round_index} already has a result")
        lease = self.store.leases(round_index).get(slot)
        if lease is None or lease.peer_id != peer_id:
            raise Refusal(403, "not_leased", f"slot {slot} of round {round_index} is not leased to this peer")
        if lease.deadline < time.time():
            raise Refusal(409, "late", f"the lease on slot {slot} expired {time.time() - lease.deadline:.1f} s ago")
        try:
            header, vector = wire.decode(body, expect_spec=session.spec, expect_round=round_index,
                                         expect_fingerprint=self.package.fingerprint)
        except wire.WireError as error:
            raise Refusal(int(getattr(error, "http_status", 400)), error.code, str(error)) from error
        if header.num_examples <= 0:
            raise Refusal(422, "num_examples", f"num_examples must be positive, got {header.num_examples}")
        norm = float(np.linalg.norm(vector.astype(np.float64) - session.weights))
        if not norm <= self.options.max_update_norm:
            raise Refusal(422, "update_norm",
                          f"update norm {norm:.4g} exceeds the bound {self.options.max_update_norm}")
        return StoredResult(round_index, slot, by_slot[slot].unit_index, peer_id, header.num_examples,
                            dict(header.metrics), body), vector

    def complete_round_blocking(self) -> dict[str, Any]:
        """Merge the stored results of the current round (runs in a worker thread).

        The weights come from what ``accept_result`` kept; after a restart they are read back from SQLite.
        Nothing else writes results meanwhile: every slot of this round is full and the next is not open.
        """
        session, round_index = self.session, self.session.round
        slots = self.store.result_slots(round_index)
        kept = {slot: self._decoded.pop((round_index, slot)) for slot in slots if (round_index, slot) in self._decoded}
        if len(kept) < len(slots):
            for slot, result in self.store.results(round_index).items():
                if slot not in kept:
                    kept[slot] = (result, wire.decode(result.message, expect_spec=session.spec)[1])
        by_slot = {a.slot: a for a in session.assignments()}
        results = [(by_slot[slot], UnitResult(vector, result.num_examples, result.metrics))
                   for slot, (result, vector) in sorted(kept.items())]
        return session.complete_round(results)

    def samples_blocking(self, weights: np.ndarray) -> list[dict[str, Any]]:
        """The page's samples for ``weights`` (generating text can cost several validations)."""
        return [{"text": s.text, "ok": s.ok} for s in self.session.task.samples(weights, self.session.data.validation)]

    def round_full(self) -> bool:
        session = self.session
        return not session.done and len(self.store.result_slots(session.round)) >= len(session.assignments())

    def schedule_merge(self) -> None:
        """Run ``maybe_complete_round`` in the background, holding a reference until it is done."""
        task = asyncio.get_running_loop().create_task(self.maybe_complete_round())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def maybe_complete_round(self) -> None:
        async with self._merge_lock:
            session = self.session
            if session.done or len(self.store.result_slots(session.round)) < len(session.assignments()):
                return
            self.merging = True
            self.changed()
            try:
                await asyncio.to_thread(self.complete_round_blocking)
            finally:
                self.merging = False
                self.work_changed()
            # After the next round is open: peers train meanwhile; the lock keeps the next merge behind it.
            rounds, weights = session.round, session.weights
            for _ in range(HANDOUT_TURNS):  # let the woken held requests take their units before the samples'
                await asyncio.sleep(0)      # thread starts competing with this loop for the GIL
            self.latest_samples = await asyncio.to_thread(self.samples_blocking, weights)
            self.samples_round = rounds
            self.changed()


def _json_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def api_routes(relay: Relay) -> list[Route]:
    options = relay.options

    def refuse(refusal: Refusal) -> JSONResponse:
        relay.store.count(f"refused.{refusal.code}")
        relay.changed()
        return _json_error(refusal.status, refusal.code, refusal.message)

    def peer_of(request: Request) -> str:
        credentials = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        peer_id, _, token = credentials.partition(":")
        if not token or not relay.store.authenticate(peer_id, token):
            raise Refusal(401, "unauthorized", "missing or wrong peer token; join first (POST /api/join)")
        return peer_id

    def require_admin(request: Request) -> None:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), options.admin_token.encode()):
            raise Refusal(401, "unauthorized", "this action needs the admin token")

    async def read_body(request: Request, limit: int) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise Refusal(413, "too_large", f"body of {declared} bytes exceeds the limit of {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise Refusal(413, "too_large", f"body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def handled(handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except Refusal as refusal:
                return refuse(refusal)
        return endpoint

    async def session_info(request: Request) -> Response:
        return JSONResponse(relay.status())

    async def task_info(request: Request) -> Response:
        manifest = relay.package.manifest
        return JSONResponse({key: manifest[key] for key in ("task_import", "settings", "spec", "fingerprint",
                                                            "kind", "model_config", "describe")}
                            | {"assets": relay.package.data.assets, "wheel": manifest.get("wheel")})

    async def join(request: Request) -> Response:
        body = await read_body(request, 4096)
        try:
            payload = json.loads(body) if body.strip() else {}
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise Refusal(400, "bad_json", f"the join body is not valid JSON: {error}") from error
        if not isinstance(payload, dict):
            raise Refusal(400, "bad_json", "the join body must be a JSON object")
        if options.join_code and not hmac.compare_digest(str(payload.get("join_code", "")).encode(),
                                                         options.join_code.encode()):
            raise Refusal(403, "join_code", "this session needs a join code")
        peer_id, token = relay.store.add_peer(request.headers.get("user-agent", ""))
        relay.work_changed()
        return JSONResponse({"peer_id": peer_id, "token": token})

    async def work(request: Request) -> Response:
        try:
            hold = float(request.query_params.get("hold", 0))
        except ValueError as error:
            raise Refusal(400, "bad_query", "hold= must be a number of seconds") from error
        if not 0 <= hold < float("inf"):
            raise Refusal(400, "bad_query", "hold= must be a number of seconds, 0 or more")
        deadline = time.monotonic() + min(hold, MAX_HOLD_SECONDS, options.peer_timeout / 2)
        while True:
            peer_id = peer_of(request)  # each pass marks the peer as seen: a held peer stays connected
            if not relay.merging and relay.round_full():  # restarted after a round's last result, before its merge
                relay.schedule_merge()
            job = relay.next_assignment(peer_id)
            remaining = deadline - time.monotonic()
            if "wait" not in job or remaining <= 0:
                return JSONResponse(job | {"wait": 0.0} if hold and "wait" in job else job)
            await relay.hold_for_work(remaining)

    async def weights(request: Request) -> Response:
        peer_of(request)
        return Response(relay.weights_message(), media_type="application/octet-stream")

    async def unit(request: Request) -> Response:
        peer_id = peer_of(request)
        index = int(request.path_params["index"])
        held = [lease for lease in relay.store.leases(relay.session.round).values()
                if lease.peer_id == peer_id and lease.unit_index == index and lease.deadline >= time.time()]
        if not held or relay.session.task.kind != "data":
            raise Refusal(403, "not_leased", f"unit {index} is not leased to this peer")
        return Response(relay.package.chunk_bytes(index), media_type="application/octet-stream")

    async def result(request: Request) -> Response:
        peer_id = peer_of(request)
        limit = relay.session.spec.size * 4 + wire.MAX_HEADER_BYTES + 16
        body = await read_body(request, limit)
        try:
            round_index, slot = int(request.query_params["round"]), int(request.query_params["slot"])
        except (KeyError, ValueError) as error:
            raise Refusal(400, "bad_query", "POST /api/result needs integer round= and slot=") from error
        relay.accept_result(peer_id, round_index, slot, body)
        relay.store.count("results_accepted")
        relay.changed()
        relay.schedule_merge()
        return JSONResponse({"accepted": True, "round": round_index, "slot": slot})

    async def events(request: Request) -> Response:
        async def stream() -> Any:
            last = -1
            while not await request.is_disconnected():
                if relay.version != last:
                    last = relay.version
                    yield f"data: {json.dumps(relay.status())}\n\n"
                try:
                    await asyncio.wait_for(relay._changed.wait(), timeout=10)
                except TimeoutError:
                    yield ": keep-alive\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def admin(request: Request) -> Response:
        require_admin(request)
        action = request.path_params["action"]
        if action == "pause":
            relay.paused = True
        elif action == "resume":
            relay.paused = False
        elif action == "stop":
            relay.session.stop("stopped by the admin")
        else:
            raise Refusal(404, "unknown_action", f"no admin action {action!r}")
        relay.work_changed()
        return JSONResponse({"ok": True, "paused": relay.paused, "stopped": relay.session.stopped})

    async def create_session(request: Request) -> Response:
        from server import admin

        require_admin(request)
        try:
            body = json.loads(await read_body(request, 65536) or b"{}")
            config = admin.config_from_request(body, relay.session.config)
            if not relay.session.done and not body.get("replace"):
                raise Refusal(409, "session_running", "the current session is still running; stop it first or "
                              'send "replace": true')
            admin.check_config(relay, config)
        except json.JSONDecodeError as error:
            raise Refusal(400, "bad_json", f"the body is not JSON: {error}") from error
        except admin.SessionRequestError as error:
            raise Refusal(422, "bad_session", str(error)) from error
        async with relay._merge_lock:
            archived = await asyncio.to_thread(admin.replace_session, relay, config)
        relay.work_changed()
        return JSONResponse({"ok": True, "archived": str(archived), "session": relay.session.describe()})

    async def export(request: Request) -> Response:
        require_admin(request)
        what = request.path_params["what"]
        if what == "model":
            from safetensors.numpy import save

            blob = save({"weights": relay.session.weights}, metadata={"spec": json.dumps(relay.session.spec.to_json()),
                                                                     "round": str(relay.session.round)})
            return Response(blob, media_type="application/octet-stream",
                            headers={"Content-Disposition": 'attachment; filename="model.safetensors"'})
        if what == "history":
            text = io.StringIO()
            for entry in relay.session.history:
                text.write(json.dumps(entry) + "\n")
            return Response(text.getvalue(), media_type="application/x-ndjson")
        raise Refusal(404, "unknown_export", f"nothing to export as {what!r}")

    return [
        Route("/api/session", session_info),
        Route("/api/task", task_info),
        Route("/api/events", events),
        Route("/api/join", handled(join), methods=["POST"]),
        Route("/api/work", handled(work), methods=["POST"]),
        Route("/api/weights", handled(weights)),
        Route("/api/unit/{index:int}", handled(unit)),
        Route("/api/result", handled(result), methods=["POST"]),
        Route("/api/admin/export/{what}", handled(export)),
        Route("/api/admin/session", handled(create_session), methods=["POST"]),
        Route("/api/admin/{action}", handled(admin), methods=["POST"]),
    ]
