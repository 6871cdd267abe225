"""What the relay's endpoints share about a request: the relay it reaches (``relay_of``), who sends it (a peer's
credentials, the admin token) and its body, bounded (``read_body``, ``read_json_object``); and the refusals each of
these may answer, as (status, code) for the endpoints' declarations (``server.relay.openapi``)."""

from __future__ import annotations

import hmac
import json

from starlette.requests import Request

from server.relay.refusal import Refusal
from server.relay.state import Relay

# Refusals shared by many endpoints, as (status, code) for their declarations.
PEER_REFUSALS = ((401, "unauthorized"), (403, "banned"))  # ``peer_of``
ADMIN_REFUSALS = ((401, "unauthorized"),)  # ``require_admin``
BODY_REFUSALS = ((413, "too_large"), (408, "body_timeout"))  # ``read_body``; serve's BodyLimits (limits.py)
JSON_REFUSALS = BODY_REFUSALS + ((400, "bad_json"),)  # ``read_json_object``
NOT_FOUND = ((404, "not_found"),)  # a path param that makes the path match no route (``routing_refusal``)


def relay_of(request: Request) -> Relay:
    """The relay, unless it is between two sessions (``SessionAdmin.replacing``: its store is closed)."""
    relay: Relay = request.app.state.relay
    if relay.replacing:
        raise Refusal(503, "replacing", "a new session is starting; try again in a moment",
                      headers={"Retry-After": "1"})
    return relay


def credentials_of(request: Request) -> tuple[str, str]:
    """(peer id, token) from ``Authorization: Bearer <peer_id>:<token>``."""
    credentials = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    peer_id, _, token = credentials.partition(":")
    return peer_id, token


def peer_of(request: Request) -> str:
    return relay_of(request).peer(*credentials_of(request))


def require_admin(request: Request) -> None:
    given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), relay_of(request).options.admin_token.encode()):
        raise Refusal(401, "unauthorized", "this action needs the admin token")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it (declared or streamed) exceeds ``limit`` bytes."""
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


async def read_json_object(request: Request, limit: int, what: str) -> dict:
    body = await read_body(request, limit)
    try:
        payload = json.loads(body) if body.strip() else {}
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Refusal(400, "bad_json", f"the {what} body is not valid JSON: {error}") from error
    except RecursionError as error:  # "[[[[..." a few thousand deep: json's parser gives up (it was a 500)
        raise Refusal(400, "bad_json", f"the {what} body nests too deeply") from error
    if not isinstance(payload, dict):
        raise Refusal(400, "bad_json", f"the {what} body must be a JSON object")
    return payload
