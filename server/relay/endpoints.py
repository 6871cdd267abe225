"""The relay's HTTP API as module-level Starlette endpoints; each reads the relay from ``request.app.state``.

JSON unless noted; weights, chunks and results are binary wire messages (``runtime.wire``):

    GET  /api/session              what the session trains, peers, round progress, refusals (public)
    GET  /api/task                 what a peer needs to build the task (import name, settings, assets, spec,
                                   and the relay's limits a peer should follow: ``limits``)
    GET  /api/events               server-sent events: the session status after every change
    POST /api/join                 {"join_code"?} -> {"peer_id", "token"}
    POST /api/leave                (peer) -> {"released": n}: the peer is going; its leases are freed at once
    POST /api/work[?hold=S]        (peer) -> an assignment with a lease deadline, or {"wait": s, "reason"};
                                   with hold, a "wait" answer is held up to S s (at most MAX_HOLD_SECONDS and
                                   half the peer timeout) and work is answered the moment it exists
    GET  /api/weights[?round=V]              (peer) the global weights of the current round
    GET  /api/weights/{digest}     the weights a job names (``weights_digest``): immutable, cacheable by anyone
    GET  /api/weights/{digest}/from/{held}   the same as a chain of compressed steps from the weights held
                                   (``runtime.deltas``), or 307 to the full weights
    GET  /api/unit/{index}         (peer, holding a lease on it) the unit's data chunk
    POST /api/result?round=&slot=  (peer) a result message; refused with 4xx and a reason, counted
    GET  /api/model[?round=best]             (anyone with serve --public-model, else admin) the model
    POST /api/admin/{pause,resume,stop}, GET /api/admin/export/{model[?round=best],history,results}  (admin)
    POST /api/admin/session        (admin token) a new session on the same package (``Relay.replace_session``)
    GET  /api/admin/peers          (admin token) every peer, its address, units and ban
    POST /api/admin/unban          (admin token) {"peer_id"}: lift a ban
    GET  /api/openapi.json         this API as an OpenAPI 3.1 document, built from the declarations below

Peers authenticate with ``Authorization: Bearer <peer_id>:<token>``, admins with ``Bearer <admin token>``.
Every refusal is a ``Refusal``; the app's exception handler (``refusal_response``) counts it and answers
``{"error": code, "message": ...}`` with its 4xx status. A path or method no route takes is answered in the same
shape under ``/api`` (``not_found``, ``method_not_allowed``: ``routing_refusal``).

Each endpoint declares what it takes and answers, every refusal code included (``@operation``,
``server.relay.openapi``); ``GET /api/openapi.json`` is built from those declarations and ``API``, and
``tests/server/relay/test_openapi.py`` fails when a ``Refusal`` code raised in ``server/relay`` is not declared.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from server.relay import openapi
from server.relay.openapi import JSON, OCTET, Answer, Body, Operation, Param, operation
from server.relay.refusal import Refusal
from server.relay.requests import (
    ADMIN_REFUSALS,
    BODY_REFUSALS,
    JSON_REFUSALS,
    NOT_FOUND,
    PEER_REFUSALS,
    credentials_of,
    peer_of,
    read_body,
    read_json_object,
    relay_of,
    require_admin,
)
from server.relay.state import MAX_HOLD_SECONDS, Relay
from server.relay.weights_endpoints import weights_chain, weights_named
from server.session.config import session_request_schema

JOIN_BODY_LIMIT = 4096  # bytes: a join body holds at most a join code
SESSION_BODY_LIMIT = 65536  # bytes: a session request is a small JSON object of settings
KEEP_ALIVE_SECONDS = 10.0  # an idle event stream sends a comment this often, so proxies keep it open
MAX_INDEX_DIGITS = 18  # a unit index in a path: int() of a longer digit string is slow or refused (4300 digits)

ROUTING_CODES = {404: "not_found", 405: "method_not_allowed"}


def refusal_response(request: Request, refusal: Exception) -> Response:
    """The exception handler for ``Refusal``: count it by code unless the relay's API has (``Relay.count_refusal``),
    tell the page, answer with its status."""
    assert isinstance(refusal, Refusal)
    relay: Relay = request.app.state.relay
    if not relay.replacing:  # (between two sessions there is no store to count in)
        relay.count_refusal(refusal)
    return JSONResponse({"error": refusal.code, "message": refusal.message}, status_code=refusal.status,
                        headers=refusal.headers)


def routing_refusal(request: Request, error: Exception) -> Response:
    """Starlette's own ``HTTPException`` (a path no route matches, a method a route does not take): under
    ``/api`` a JSON refusal with a code like every other; elsewhere (the page, its assets) plain text as before."""
    assert isinstance(error, HTTPException)
    if error.status_code in (204, 304):
        return Response(status_code=error.status_code, headers=error.headers)
    if not request.url.path.startswith(API_PREFIX + "/"):
        return PlainTextResponse(error.detail, status_code=error.status_code, headers=error.headers)
    code = ROUTING_CODES.get(error.status_code, "http_error")
    return JSONResponse({"error": code, "message": f"{request.method} {request.url.path}: {error.detail}"},
                        status_code=error.status_code, headers=error.headers)


# -- public -------------------------------------------------------------------------------------
STATUS_ANSWER = Answer(description="the session: task, plan, round progress, peers, history, counters, defenses")


@operation(Operation(summary="what the session trains, its peers, round progress and refusals",
                     answers=[STATUS_ANSWER]))
async def session_info(request: Request) -> Response:
    return JSONResponse(relay_of(request).status())


@operation(Operation(summary="what a peer needs to build the task, and the relay's limits (`limits`)",
                     answers=[Answer(description="import name, settings, assets, spec and limits")]))
async def task_info(request: Request) -> Response:
    relay = relay_of(request)
    # (devices: where a session's replays judge results bit for bit on the CPU, a page trains on the CPU)
    devices = {"devices": ["cpu"]} if relay.verification.refusal("pyodide-webgpu") is not None else {}
    return JSONResponse(relay.package.task_description() | {"limits": relay.peer_limits()} | devices)


EVENT_INTERVAL = 0.5  # seconds: the most often one page's stream sends a status


def status_event(relay: Relay) -> str:
    """The status as an event, built once per relay version and shared by every stream (200 pages watching
    used to build it 200 times per change: most of the relay's time under load, ``peertrain bench load``)."""
    return relay.status_event()


@operation(Operation(summary="server-sent events: the session status after every change",
                     description="A stream that never ends (a comment every 10 s when idle). HEAD answers its "
                     "headers at once and leaves the connection free for the next request.",
                     answers=[Answer(description="`data:` lines of the session status",
                                     content={"text/event-stream": {"type": "string"}})]))
async def events(request: Request) -> Response:
    relay = relay_of(request)
    if request.method == "HEAD":  # the headers only: a stream that never ends has no body to leave out
        return Response(media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def stream() -> AsyncIterator[str]:
        last = -1
        while not await request.is_disconnected():
            if relay.version != last and not relay.replacing:  # (the new session's status comes once it runs)
                last = relay.version
                yield status_event(relay)
                await asyncio.sleep(EVENT_INTERVAL)  # changes meanwhile are coalesced into the next event
                continue
            if not await relay.notices.wait_for_change(KEEP_ALIVE_SECONDS):
                yield ": keep-alive\n\n"
    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@operation(Operation(summary="the API as an OpenAPI document, built from the endpoints' declarations",
                     answers=[Answer(description="OpenAPI 3.1")]))
async def openapi_document(request: Request) -> Response:
    return JSONResponse(openapi.document(API))


# -- peers --------------------------------------------------------------------------------------
@operation(Operation(
    summary="join the session: a peer id and its token",
    body=Body(schema={"type": "object", "properties": {"join_code": {"type": "string"}}},
              description=f"at most {JOIN_BODY_LIMIT} bytes; an empty body is {{}}"),
    answers=[Answer(description="the peer's credentials (Authorization: Bearer <peer_id>:<token>)",
                    content={JSON: {"type": "object", "required": ["peer_id", "token"],
                                    "properties": {"peer_id": {"type": "string"}, "token": {"type": "string"}}}})],
    refusals=[*JSON_REFUSALS, (403, "join_code"), (403, "banned"), (429, "join_rate"), (429, "too_many_peers")]))
async def join(request: Request) -> Response:
    relay = relay_of(request)
    payload = await read_json_object(request, JOIN_BODY_LIMIT, "join")
    address = request.client.host if request.client else "unknown"  # (behind a proxy: the app's ProxyHeaders)
    peer_id, token = relay.join(address, agent=request.headers.get("user-agent", ""),
                                join_code=str(payload.get("join_code", "")))
    return JSONResponse({"peer_id": peer_id, "token": token})


@operation(Operation(
    summary="an assignment with a lease deadline, or {wait, reason}, or {done}", auth="peer",
    params=[Param(name="hold", schema={"type": "number", "minimum": 0},
                  description=f"hold a wait answer up to this many seconds (at most {MAX_HOLD_SECONDS:g} and half "
                  "the peer timeout); work is answered the moment it exists")],
    answers=[Answer(description="an assignment (round, slot, unit_index, lease deadline), a wait or done")],
    refusals=[*PEER_REFUSALS, (400, "bad_query")]))
async def work(request: Request) -> Response:
    relay = relay_of(request)
    try:
        hold = float(request.query_params.get("hold", 0))
    except ValueError as error:
        raise Refusal(400, "bad_query", "hold= must be a number of seconds") from error
    if not 0 <= hold < float("inf"):
        raise Refusal(400, "bad_query", "hold= must be a number of seconds, 0 or more")
    return JSONResponse(await relay.work(*credentials_of(request), hold=hold))


@operation(Operation(
    summary="the global weights of the current round (or of ?round=V) as a wire message", auth="peer",
    params=[Param(name="round", schema={"type": "integer", "minimum": 0},
                  description="a job's weights_round: the current round, or in async mode a kept recent version")],
    answers=[Answer(description="a weights message (runtime.wire)", content={OCTET: {}})],
    refusals=[*PEER_REFUSALS, (400, "bad_query"), (409, "stale_round")]))
async def weights(request: Request) -> Response:
    """The current weights, or with ``?round=V`` that version (a job's ``weights_round``): the current one, or in
    async mode one of the kept recent versions; another is refused (``409 stale_round``)."""
    peer_of(request)
    relay = relay_of(request)
    asked = request.query_params.get("round")
    if asked is None:
        return Response(relay.weights_message(), media_type="application/octet-stream")
    try:
        version = int(asked)
    except ValueError as error:
        raise Refusal(400, "bad_query", "round= must be an integer") from error
    message = relay.weights_of(version)
    if message is None:
        raise Refusal(409, "stale_round", f"weights of round {version} are not kept (current: {relay.session.round})")
    return Response(message, media_type="application/octet-stream")


@operation(Operation(
    summary="the data chunk of a unit leased to this peer, as an array message", auth="peer",
    params=[Param(name="index", where="path", schema={"type": "integer", "minimum": 0})],
    answers=[Answer(description="an array message (runtime.wire)", content={OCTET: {}})],
    refusals=[*PEER_REFUSALS, *NOT_FOUND, (404, "unknown_unit"), (403, "not_leased")]))
async def unit(request: Request) -> Response:
    relay = relay_of(request)
    peer_id = peer_of(request)
    index = unit_index(request.path_params["index"])
    if not relay.holds_unit(peer_id, index) or relay.session.task.kind != "data":
        raise Refusal(403, "not_leased", f"unit {index} is not leased to this peer")
    return Response(relay.package.chunk_bytes(index), media_type="application/octet-stream")


def unit_index(text: str) -> int:
    """A unit index from the path: ASCII digits only (``int`` also reads "٣" and "1_0", and refuses 4300 digits
    with a ValueError that Starlette's ``int`` convertor let through as a 500)."""
    if not (text.isascii() and text.isdigit() and len(text) <= MAX_INDEX_DIGITS):
        raise Refusal(404, "unknown_unit", f"no unit {text[:40]!r}: a unit index is a non-negative integer")
    return int(text)


RESULT_REFUSALS = (*PEER_REFUSALS, *BODY_REFUSALS, (400, "bad_query"),
                   # the lease and the round (SyncRounds.accept; async: AsyncBuffer.accept)
                   (409, "stale_round"), (404, "unknown_slot"), (409, "past_deadline"), (409, "round_redone"),
                   (409, "duplicate"), (403, "not_leased"), (409, "late"), (409, "too_stale"),
                   # the message itself (server.relay.checks)
                   *openapi.wire_refusals(), (422, "num_examples"), (422, "num_examples_claim"),
                   (422, "update_norm"), (422, "update_outlier"), (422, "local_dp"), (422, "engine_not_replayable"))


@operation(Operation(
    summary="upload a result message for (round, slot); refused with 4xx and a reason, counted", auth="peer",
    params=[Param(name="round", schema={"type": "integer", "minimum": 0}, required=True),
            Param(name="slot", schema={"type": "integer", "minimum": 0}, required=True)],
    body=Body(media_type=OCTET, required=True, description="a weights message (runtime.wire) with the result"),
    answers=[Answer(description="accepted", content={JSON: {
        "type": "object", "properties": {"accepted": {"type": "boolean"}, "round": {"type": "integer"},
                                         "slot": {"type": "integer"}}}})],
    refusals=RESULT_REFUSALS))
async def result(request: Request) -> Response:
    relay = relay_of(request)
    peer_id = peer_of(request)
    body = await read_body(request, relay.result_body_limit)
    try:
        round_index, slot = int(request.query_params["round"]), int(request.query_params["slot"])
    except (KeyError, ValueError) as error:
        raise Refusal(400, "bad_query", "POST /api/result needs integer round= and slot=") from error
    relay.submit_result(peer_id, round_index, slot, body)
    return JSONResponse({"accepted": True, "round": round_index, "slot": slot})


@operation(Operation(
    summary="the peer is going (its page closes, or it gives a core fewer): its leases are released at once",
    auth="peer",
    answers=[Answer(description="how many leases were released; the peer no longer counts as connected (asking for "
                    "work again brings it back)", content={JSON: {
                        "type": "object", "properties": {"released": {"type": "integer"}}}})],
    refusals=list(PEER_REFUSALS)))
async def leave(request: Request) -> Response:
    return JSONResponse({"released": relay_of(request).leave(*credentials_of(request))})


# -- admin --------------------------------------------------------------------------------------
ADMIN_ACTIONS = ("pause", "resume", "stop")


@operation(Operation(
    summary="pause or resume handing out work, or stop the session", auth="admin",
    params=[Param(name="action", where="path", schema={"type": "string", "enum": list(ADMIN_ACTIONS)})],
    answers=[Answer(description="the relay's state after the action")],
    refusals=[*ADMIN_REFUSALS, *NOT_FOUND, (404, "unknown_action")]))
async def admin_action(request: Request) -> Response:
    require_admin(request)
    relay = relay_of(request)
    relay.admin.admin_action(request.path_params["action"])
    return JSONResponse({"ok": True, "paused": relay.paused, "stopped": relay.session.stopped})


@operation(Operation(summary="every peer: address, units, last seen, ban and its reason", auth="admin",
                     answers=[Answer(description="{peers: [...]}")], refusals=ADMIN_REFUSALS))
async def admin_peers(request: Request) -> Response:
    """Every peer: address, units, last seen, and its ban with the reason."""
    require_admin(request)
    return JSONResponse({"peers": relay_of(request).store.peers_listing()})


@operation(Operation(
    summary="lift a peer's ban", auth="admin",
    body=Body(schema={"type": "object", "properties": {"peer_id": {"type": "string"}}}),
    answers=[Answer(description="unbanned")],
    refusals=[*ADMIN_REFUSALS, *JSON_REFUSALS, (404, "not_banned")]))
async def admin_unban(request: Request) -> Response:
    """Lift a ban: ``{"peer_id": ...}``."""
    require_admin(request)
    payload = await read_json_object(request, JOIN_BODY_LIMIT, "unban")
    peer_id = str(payload.get("peer_id", ""))
    if not relay_of(request).bans.unban(peer_id):
        raise Refusal(404, "not_banned", f"peer {peer_id!r} is not banned")
    return JSONResponse({"ok": True, "peer_id": peer_id})


# The settings ``POST /api/admin/session`` may change, as declared (``server.session.config.SETTABLE``), and its flag.
SESSION_SETTINGS: dict[str, dict[str, object]] = session_request_schema()


@operation(Operation(
    summary="a new session on the same package: the current settings with the body's replaced", auth="admin",
    body=Body(schema={"type": "object", "properties": SESSION_SETTINGS, "additionalProperties": False},
              description=f"a JSON object of settings, at most {SESSION_BODY_LIMIT} bytes"),
    answers=[Answer(description="the old session's archive folder and the new session")],
    refusals=[*ADMIN_REFUSALS, *JSON_REFUSALS, (409, "session_running"), (422, "bad_session"),
              (409, "no_session_folder")]))
async def create_session(request: Request) -> Response:
    require_admin(request)
    relay = relay_of(request)
    body = await read_json_object(request, SESSION_BODY_LIMIT, "session")
    archived = await relay.admin.replace_session(body)
    return JSONResponse({"ok": True, "archived": str(archived), "session": relay.session.describe()})


def model_response(request: Request) -> Response:
    """The model as named-tensor safetensors, with what a loader needs in the metadata (server.session.export)."""
    from server.session.export import model_metadata, safetensors_bytes
    from server.session.privacy import of_weights

    relay = relay_of(request)
    session, which = relay.session, request.query_params.get("round", "latest")
    if which not in ("latest", "best"):
        raise Refusal(400, "bad_query", "round= must be latest or best")
    weights = session.weights if which == "latest" else session.best_weights
    rounds = session.round if which == "latest" else (session.best_round or -1) + 1
    metadata = model_metadata(spec=session.spec, task_info=relay.package.task_description(),
                              model_config=session.task.model_config(), round_index=rounds,
                              fingerprint=relay.package.fingerprint,
                              privacy=of_weights(session.history, rounds, session.privacy is not None))
    name = f"{session.task.name}-round{rounds}.safetensors"
    return Response(safetensors_bytes(weights, metadata), media_type="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


MODEL_ROUND = Param(name="round", schema={"type": "string", "enum": ["latest", "best"]},
                    description="latest (default) or best: the round with the best validation metric")
MODEL_ANSWER = Answer(description="the model as named-tensor safetensors", content={OCTET: {}},
                      headers={"Content-Disposition": "attachment; filename=<task>-round<N>.safetensors"})


@operation(Operation(summary="the model (the page's Download link)", auth="model",
                     description="Anyone's with `serve --public-model`, else the admin's.",
                     params=[MODEL_ROUND], answers=[MODEL_ANSWER], refusals=[*ADMIN_REFUSALS, (400, "bad_query")]))
async def model(request: Request) -> Response:
    """The page's Download link: anyone's with ``serve --public-model``, else the admin's."""
    if not relay_of(request).options.public_model:
        require_admin(request)
    return model_response(request)


@operation(Operation(
    summary="export the model (safetensors), the full history or the results' audit rows (JSON lines)",
    auth="admin", params=[Param(name="what", where="path", schema={"type": "string", "enum": [
        "model", "history", "results"]}), MODEL_ROUND],
    answers=[Answer(description="model: safetensors; history: one JSON object per round; results: one per merged "
                    "result (round, slot, unit, peer, examples, metrics, sha256 and size of its message, how it was "
                    "verified, whether the message is still kept)",
                    content={OCTET: {}, "application/x-ndjson": {"type": "string"}})],
    refusals=[*ADMIN_REFUSALS, *NOT_FOUND, (400, "bad_query"), (404, "unknown_export")]))
async def export(request: Request) -> Response:
    require_admin(request)
    relay = relay_of(request)
    what = request.path_params["what"]
    if what == "model":
        return model_response(request)
    if what == "history":
        text = io.StringIO()
        for entry in relay.session.history:
            text.write(json.dumps(entry) + "\n")
        return Response(text.getvalue(), media_type="application/x-ndjson")
    if what == "results":
        rows = await asyncio.to_thread(relay.store.audit)
        return Response("".join(json.dumps(row) + "\n" for row in rows), media_type="application/x-ndjson")
    raise Refusal(404, "unknown_export", f"nothing to export as {what!r}")


API_PREFIX = "/api"
API = Mount(API_PREFIX, routes=[
    Route("/session", session_info),
    Route("/task", task_info),
    Route("/events", events),
    Route("/openapi.json", openapi_document),
    Route("/join", join, methods=["POST"]),
    Route("/work", work, methods=["POST"]),
    Route("/leave", leave, methods=["POST"]),
    Route("/weights", weights),
    Route("/weights/{digest}", weights_named),
    Route("/weights/{digest}/from/{held}", weights_chain),
    Route("/unit/{index}", unit),  # (parsed by ``unit_index``: Starlette's int convertor let huge numbers 500)
    Route("/result", result, methods=["POST"]),
    Route("/model", model),
    Route("/admin/export/{what}", export),
    Route("/admin/session", create_session, methods=["POST"]),
    Route("/admin/peers", admin_peers),
    Route("/admin/unban", admin_unban, methods=["POST"]),
    Route("/admin/{action}", admin_action, methods=["POST"]),
])
EXCEPTION_HANDLERS = {Refusal: refusal_response, HTTPException: routing_refusal}
__all__ = ["API", "EXCEPTION_HANDLERS", "MAX_HOLD_SECONDS"]
