"""The relay's HTTP API as module-level Starlette endpoints; each reads the relay from ``request.app.state``.

JSON unless noted; weights, chunks and results are binary wire messages (``runtime.wire``):

    GET  /api/session              what the session trains, peers, round progress, refusals (public)
    GET  /api/task                 what a peer needs to build the task (import name, settings, assets, spec,
                                   and the relay's limits a peer should follow: ``limits``)
    GET  /api/events               server-sent events: the session status after every change
    POST /api/challenge            -> {"challenge"}: what a join signs with its page's volunteer key
    POST /api/join                 {"join_code"?, "volunteer"?: {public_key, challenge, signature, name?, team?}}
                                   -> {"peer_id", "token", "volunteer"?}
    POST /api/volunteer            (peer) {"name"?, "team"?}: the volunteer's display name and team
    GET  /api/credit[?top=N&volunteer=V]     credit for verified work: the leaderboard, teams, one's own place
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

This module holds the route table (``API``), the refusals' handlers and the public endpoints (the session, the
task, the event stream, the OpenAPI document); the others live by resource: the peers' (``peer_endpoints``), the
weights' (``weights_endpoints``) and the host's (``admin_endpoints``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from server.relay import openapi
from server.relay.admin_endpoints import admin_action, admin_peers, admin_unban, create_session, export, model
from server.relay.openapi import Answer, Operation, operation
from server.relay.peer_endpoints import join, leave, result, unit, work
from server.relay.refusal import Refusal
from server.relay.requests import relay_of
from server.relay.state import Relay
from server.relay.volunteer_endpoints import challenge, credit, volunteer
from server.relay.weights_endpoints import weights, weights_chain, weights_named

KEEP_ALIVE_SECONDS = 10.0  # an idle event stream sends a comment this often, so proxies keep it open

ROUTING_CODES = {404: "not_found", 405: "method_not_allowed"}


def refusal_response(request: Request, refusal: Exception) -> Response:
    """The exception handler for ``Refusal``: count it by code unless the relay's API has (``Relay.count_refusal``),
    tell the page, answer with its status."""
    assert isinstance(refusal, Refusal)
    relay: Relay = request.app.state.relay
    if not relay.replacing:  # (between two sessions there is no store to count in)
        relay.count_refusal(refusal)
    return JSONResponse(refusal.to_json(), status_code=refusal.status,
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


API_PREFIX = "/api"
API = Mount(API_PREFIX, routes=[
    Route("/session", session_info),
    Route("/task", task_info),
    Route("/events", events),
    Route("/openapi.json", openapi_document),
    Route("/challenge", challenge, methods=["POST"]),
    Route("/join", join, methods=["POST"]),
    Route("/volunteer", volunteer, methods=["POST"]),
    Route("/credit", credit),
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
__all__ = ["API", "EXCEPTION_HANDLERS"]
