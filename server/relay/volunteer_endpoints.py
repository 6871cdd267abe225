"""The volunteers' endpoints: ``POST /api/challenge`` (what a page signs to prove its key when it joins),
``POST /api/volunteer`` (a volunteer's display name and team) and ``GET /api/credit`` (the leaderboard).

Who a volunteer is and how a join proves it: ``server.relay.volunteers``; how credit is counted:
``server.relay.credit``. The route table and the API's map: ``server.relay.endpoints``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.relay.credit import TOP
from server.relay.openapi import JSON, Answer, Body, Operation, Param, operation
from server.relay.refusal import Refusal
from server.relay.requests import JSON_REFUSALS, PEER_REFUSALS, peer_of, read_json_object, relay_of
from server.relay.volunteers import MAX_NAME_CHARS

PROFILE_BODY_LIMIT = 1024  # bytes: a name and a team
MAX_TOP = 1000  # the most volunteers one /api/credit lists


@operation(Operation(
    summary="a challenge to sign with the volunteer key, for the next join (single-use, valid a few minutes)",
    answers=[Answer(description="the challenge; the join signs \"peertrain-join:\" + challenge (ECDSA P-256, "
                    "SHA-256) and sends it as its volunteer proof", content={JSON: {
                        "type": "object", "required": ["challenge"],
                        "properties": {"challenge": {"type": "string"}, "expires_seconds": {"type": "number"}}}})]))
async def challenge(request: Request) -> Response:
    return JSONResponse(relay_of(request).volunteers.challenge())


@operation(Operation(
    summary="set this peer's volunteer's display name and team (each optional)", auth="peer",
    body=Body(schema={"type": "object", "properties": {
        "name": {"type": "string", "maxLength": MAX_NAME_CHARS},
        "team": {"type": "string", "maxLength": MAX_NAME_CHARS}}},
              description=f"at most {PROFILE_BODY_LIMIT} bytes; an empty name or team clears it"),
    answers=[Answer(description="the volunteer, its name and team")],
    refusals=[*PEER_REFUSALS, *JSON_REFUSALS, (400, "bad_volunteer"), (409, "no_volunteer")]))
async def volunteer(request: Request) -> Response:
    relay = relay_of(request)
    peer_id = peer_of(request)
    payload = await read_json_object(request, PROFILE_BODY_LIMIT, "volunteer")
    return JSONResponse(relay.volunteers.set_profile(peer_id, payload))


@operation(Operation(
    summary="credit for verified work: the top volunteers and teams, and one volunteer's own place",
    params=[Param(name="top", schema={"type": "integer", "minimum": 0, "maximum": MAX_TOP},
                  description=f"how many volunteers and teams to list (default {TOP})"),
            Param(name="volunteer", schema={"type": "string", "maxLength": 64},
                  description="a volunteer (or a peer without a key) whose entry comes as you")],
    answers=[Answer(description="unit, total, volunteers (rank, volunteer, name, team, total, recent_average, "
                    "units, workers), teams, you, count")],
    refusals=[(400, "bad_query")]))
async def credit(request: Request) -> Response:
    relay = relay_of(request)
    try:
        top = int(request.query_params.get("top", TOP))
    except ValueError as error:
        raise Refusal(400, "bad_query", "top= must be a whole number") from error
    if not 0 <= top <= MAX_TOP:
        raise Refusal(400, "bad_query", f"top= must be between 0 and {MAX_TOP}")
    return JSONResponse(relay.credit.board(top=top, volunteer=request.query_params.get("volunteer") or None))
