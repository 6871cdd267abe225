"""The host's endpoints: pause, resume and stop (``POST /api/admin/{action}``), the peers and their bans
(``GET /api/admin/peers``, ``POST /api/admin/unban``), a new session (``POST /api/admin/session``), and what a
session leaves: the model (``GET /api/model``, public with ``serve --public-model``) and the exports
(``GET /api/admin/export/{model,history,results}``).

Every one but a public model needs the admin token (``Authorization: Bearer <admin token>``: ``require_admin``).
The route table and the API's map: ``server.relay.endpoints``.
"""

from __future__ import annotations

import asyncio
import io
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.relay.openapi import OCTET, Answer, Body, Operation, Param, operation
from server.relay.refusal import Refusal
from server.relay.requests import ADMIN_REFUSALS, JSON_REFUSALS, NOT_FOUND, read_json_object, relay_of, require_admin
from server.session.config import session_request_schema

UNBAN_BODY_LIMIT = 4096  # bytes: an unban body holds a peer id
SESSION_BODY_LIMIT = 65536  # bytes: a session request is a small JSON object of settings
ADMIN_ACTIONS = ("pause", "pause-after-round", "resume", "stop")
REPLICA = (409, "replica")  # a change only the relay holding the session makes (``server.relay.sharing``)


@operation(Operation(
    summary="pause or resume handing out work, or stop the session", auth="admin",
    description="`pause-after-round` hands out the current round to its end (also when paused) and pauses once "
    "it has merged: one round at a time. A pause is kept in the relay's store: every relay serving the session "
    "holds it, and a restarted relay stays paused until `resume`.",
    params=[Param(name="action", where="path", schema={"type": "string", "enum": list(ADMIN_ACTIONS)})],
    answers=[Answer(description="the relay's state after the action")],
    refusals=[*ADMIN_REFUSALS, *NOT_FOUND, (404, "unknown_action"), REPLICA]))
async def admin_action(request: Request) -> Response:
    require_admin(request)
    relay = relay_of(request)
    relay.sharing.refuse_on_replica("pause, resume or stop the session")
    relay.admin.admin_action(request.path_params["action"])
    return JSONResponse({"ok": True, "paused": relay.paused, "pause_from": relay.admin.pause_from,
                         "stopped": relay.session.stopped})


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
    refusals=[*ADMIN_REFUSALS, *JSON_REFUSALS, (404, "not_banned"), REPLICA]))
async def admin_unban(request: Request) -> Response:
    """Lift a ban: ``{"peer_id": ...}``."""
    require_admin(request)
    relay_of(request).sharing.refuse_on_replica("lift a ban (and undo what it undid)")
    payload = await read_json_object(request, UNBAN_BODY_LIMIT, "unban")
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
    refusals=[*ADMIN_REFUSALS, *JSON_REFUSALS, (409, "session_running"), (422, "bad_session"), REPLICA,
              (409, "no_session_folder")]))
async def create_session(request: Request) -> Response:
    require_admin(request)
    relay = relay_of(request)
    relay.sharing.refuse_on_replica("start a new session")
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
                    "verified, whether the message is still kept; async: the merge as its round, its schedule entry "
                    "as its slot, and started_from)",
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

