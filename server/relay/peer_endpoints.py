"""The peers' endpoints: ``POST /api/join``, ``POST /api/work[?hold=S]``, ``GET /api/unit/{index}``,
``POST /api/result?round=&slot=`` and ``POST /api/leave`` (their weights: ``server.relay.weights_endpoints``).

Each carries the relay's transport-free API (``server.relay.state.Relay``) over HTTP: it reads the request, calls the
relay and answers JSON (a unit's data as a wire message); every refusal is a ``Refusal`` (``server.relay.endpoints``
answers it). The route table and the API's map: ``server.relay.endpoints``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.relay import openapi
from server.relay.limits import restart_body_clock
from server.relay.openapi import JSON, OCTET, Answer, Body, Operation, Param, operation
from server.relay.refusal import Refusal
from server.relay.requests import (
    BODY_REFUSALS,
    JSON_REFUSALS,
    NOT_FOUND,
    PEER_REFUSALS,
    credentials_of,
    peer_of,
    read_body,
    read_json_object,
    relay_of,
)
from server.relay.state import MAX_HOLD_SECONDS
from server.relay.volunteers import MAX_NAME_CHARS, parse_proof

JOIN_BODY_LIMIT = 4096  # bytes: a join body holds at most a join code
MAX_TICKET_CHARS = 100  # a join's ticket (server.relay.admission): a longer one is not one the relay gave
MAX_ENGINE_CLASS_CHARS = 200  # a join's engine class (``runtime.peer.engine_class``: under 100 characters)
MAX_INDEX_DIGITS = 18  # a unit index in a path: int() of a longer digit string is slow or refused (4300 digits)


@operation(Operation(
    summary="join the session: a peer id and its token",
    body=Body(schema={"type": "object", "properties": {
        "join_code": {"type": "string"}, "ticket": {"type": "string"},
        "engine_class": {"type": "string", "maxLength": MAX_ENGINE_CLASS_CHARS},
        "volunteer": {"type": "object", "properties": {
            "public_key": {"type": "string"}, "challenge": {"type": "string"}, "signature": {"type": "string"},
            "name": {"type": "string", "maxLength": MAX_NAME_CHARS},
            "team": {"type": "string", "maxLength": MAX_NAME_CHARS}}}}},
              description=f"at most {JOIN_BODY_LIMIT} bytes; an empty body is {{}}; ticket: the one a 429 join_rate "
              "gave this address, which keeps the join's place in the address's queue; engine_class: what the peer "
              "trains on (runtime.peer.engine_class), so that a copy of its units goes to a peer of the same class "
              "where the host cannot replay them; volunteer: the proof of the key the page keeps (POST /api/challenge, "
              "signed with it: server.relay.volunteers), so that its credit, record and bans last"),
    answers=[Answer(description="the peer's credentials (Authorization: Bearer <peer_id>:<token>) and its volunteer",
                    content={JSON: {"type": "object", "required": ["peer_id", "token"],
                                    "properties": {"peer_id": {"type": "string"}, "token": {"type": "string"},
                                                   "volunteer": {"type": "string"}}}})],
    refusals=[*JSON_REFUSALS, (400, "bad_engine_class"), (400, "bad_volunteer"), (403, "join_code"), (403, "banned"),
              (403, "volunteer_proof"), (429, "join_rate"), (429, "too_many_peers")]))
async def join(request: Request) -> Response:
    relay = relay_of(request)
    payload = await read_json_object(request, JOIN_BODY_LIMIT, "join")
    address = request.client.host if request.client else "unknown"  # (behind a proxy: the app's ProxyHeaders)
    engine_class = payload.get("engine_class", "")
    if not isinstance(engine_class, str) or len(engine_class) > MAX_ENGINE_CLASS_CHARS or \
            not engine_class.isprintable():
        raise Refusal(400, "bad_engine_class", f"engine_class must be printable text of at most "
                      f"{MAX_ENGINE_CLASS_CHARS} characters (runtime.peer.engine_class)")
    proof = parse_proof(payload.get("volunteer"))
    peer_id, token = relay.join(address, agent=request.headers.get("user-agent", ""),
                                join_code=str(payload.get("join_code", "")),
                                ticket=str(payload.get("ticket", ""))[:MAX_TICKET_CHARS], engine_class=engine_class,
                                volunteer=proof)
    return JSONResponse({"peer_id": peer_id, "token": token} | ({"volunteer": proof.volunteer_id} if proof else {}))


@operation(Operation(
    summary="an assignment with a lease deadline, or {wait, reason}, or {done}", auth="peer",
    params=[Param(name="hold", schema={"type": "number", "minimum": 0},
                  description=f"hold a wait answer up to this many seconds (at most {MAX_HOLD_SECONDS:g} and half "
                  "the peer timeout); work is answered the moment it exists"),
            Param(name="back", schema={"type": "integer", "enum": [0, 1]},
                  description="1: this peer left (POST /api/leave) and comes back; without it a peer that left is "
                  "answered a wait (an ask it sent before leaving may arrive after)")],
    answers=[Answer(description="an assignment (round, slot, unit_index, lease deadline), a wait or done")],
    refusals=[*PEER_REFUSALS, (400, "bad_query"), (422, "engine_not_replayable")]))
async def work(request: Request) -> Response:
    relay = relay_of(request)
    try:
        hold = float(request.query_params.get("hold", 0))
    except ValueError as error:
        raise Refusal(400, "bad_query", "hold= must be a number of seconds") from error
    if not 0 <= hold < float("inf"):
        raise Refusal(400, "bad_query", "hold= must be a number of seconds, 0 or more")
    back = request.query_params.get("back", "0")
    if back not in ("0", "1"):
        raise Refusal(400, "bad_query", "back= must be 0 or 1")
    return JSONResponse((await relay.work(*credentials_of(request), hold=hold, back=back == "1")).to_json())


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
                   (422, "update_norm"), (422, "update_outlier"), (422, "local_dp"), (422, "engine_not_replayable"),
                   # a replica of a synchronous session whose holder judged nothing (server.relay.sharing)
                   (503, "holder_unavailable"))


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
    try:
        round_index, slot = int(request.query_params["round"]), int(request.query_params["slot"])
    except (KeyError, ValueError) as error:
        raise Refusal(400, "bad_query", "POST /api/result needs integer round= and slot=") from error
    async with relay.uploading(peer_id, round_index, slot):  # (its turn: the body is read only now, its time to
        restart_body_clock(request.scope)  # arrive counted from now)
        body = await read_body(request, relay.result_body_limit)
        await relay.sharing.catch_up(round_index)  # (a replica: a result from weights the holder merged since)
        await relay.submit(peer_id, round_index, slot, body)
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

