"""The weights' endpoints: ``GET /api/weights[?round=V]`` (a peer's: the current weights, or a version its job names),
and weights by digest: ``GET /api/weights/{digest}`` (the full message) and ``GET /api/weights/{digest}/from/{held}``
(the chain of compressed steps from the weights a peer holds, ``runtime.deltas``), both immutable and cacheable by
anyone: a job names its weights by the sha256 of their bytes (``server.relay.jobs``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.relay.openapi import OCTET, Answer, Operation, Param, operation
from server.relay.refusal import Refusal
from server.relay.requests import NOT_FOUND, PEER_REFUSALS, peer_of, relay_of

WEIGHTS_PATH = "/api/weights"
IMMUTABLE = "public, max-age=31536000, immutable"  # a content-addressed answer never changes
DIGEST_PARAM = Param(name="digest", where="path", schema={"type": "string", "pattern": "^[0-9a-f]{64}$"},
                     description="the sha256 of the weights' float32 bytes (a job's weights_digest)")


def digest_param(request: Request, name: str) -> str:
    text = request.path_params[name]
    if len(text) != 64 or not all(c in "0123456789abcdef" for c in text):
        raise Refusal(404, "unknown_weights", f"no weights {text[:70]!r}: weights are named by 64 hex digits")
    return str(text)


def immutable_response(request: Request, body: bytes, etag: str) -> Response:
    """A content-addressed answer: cacheable by anyone for a year, with a strong ETag (``If-None-Match`` -> 304)."""
    tag = f'"{etag}"'
    headers = {"ETag": tag, "Cache-Control": IMMUTABLE}
    if tag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/octet-stream", headers=headers)


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
    await relay.sharing.catch_up(version)  # (a replica: weights the holder merged since)
    message = relay.weights_of(version)
    if message is None:
        raise Refusal(409, "stale_round", f"weights of round {version} are not kept (current: {relay.session.round})")
    return Response(message, media_type="application/octet-stream")


@operation(Operation(
    summary="the weights a digest names (the current ones, or a kept version), as a weights message",
    description="Content-addressed and immutable: `Cache-Control: public, max-age=31536000, immutable` and a strong "
    "ETag, so any HTTP cache in front of the relay serves the fan-out. No credentials: the digest is only "
    "known to those handed a job (256 bits, not guessable).",
    params=[DIGEST_PARAM],
    answers=[Answer(description="a weights message (runtime.wire)", content={OCTET: {}},
                    headers={"ETag": "the digest, quoted", "Cache-Control": IMMUTABLE})],
    refusals=[*NOT_FOUND, (404, "unknown_weights")]))
async def weights_named(request: Request) -> Response:
    relay = relay_of(request)
    digest = digest_param(request, "digest")
    message = relay.jobs.named(digest)
    if message is None and await relay.sharing.catch_up():  # (a replica: weights the holder merged since)
        message = relay.jobs.named(digest)
    if message is None:
        raise Refusal(404, "unknown_weights", f"weights {digest[:16]} are not served now; ask POST /api/work for the "
                      "current ones")
    relay.store.count("weights_sent_full")
    relay.store.count("weights_bytes_full", len(message))
    return immutable_response(request, message, digest)


@operation(Operation(
    summary="the weights a digest names, as the chain of compressed steps from the weights a peer holds",
    description="Sessions with `--codec int8|topk` move their weights by compressed steps (runtime.deltas): a peer "
    "holding earlier weights rebuilds the newest from the chain, bit for bit. Where the relay keeps no such chain "
    "or the chain is no smaller than the weights, a 307 redirect to the full weights.",
    params=[DIGEST_PARAM, Param(name="held", where="path", schema={"type": "string", "pattern": "^[0-9a-f]{64}$"},
                                description="the digest of the weights the peer holds")],
    answers=[Answer(description="a chain message (runtime.deltas), or 307 to /api/weights/{digest}",
                    content={OCTET: {}}, headers={"ETag": "quoted", "Cache-Control": IMMUTABLE})],
    refusals=[*NOT_FOUND, (404, "unknown_weights")]))
async def weights_chain(request: Request) -> Response:
    relay = relay_of(request)
    digest, held = digest_param(request, "digest"), digest_param(request, "held")
    if relay.jobs.version_named(digest) is None and not (await relay.sharing.catch_up() and
                                                         relay.jobs.version_named(digest) is not None):
        raise Refusal(404, "unknown_weights", f"weights {digest[:16]} are not served now; ask POST /api/work for the "
                      "current ones")
    message = relay.jobs.chain(digest, held)
    if message is None:
        return Response(status_code=307, headers={"Location": f"{WEIGHTS_PATH}/{digest}",
                                                  "Cache-Control": "no-store"})
    relay.store.count("weights_sent_chain")
    relay.store.count("weights_bytes_chain", len(message))
    return immutable_response(request, message, f"{digest}-from-{held}")
