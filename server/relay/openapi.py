"""The relay's API as an OpenAPI 3.1 document (``GET /api/openapi.json``), built from the routes themselves.

Each endpoint function in ``server.relay.endpoints`` carries an ``Operation`` (``@operation(...)``): a summary,
who may call it, its query and path parameters, its request body and its answers, every refusal among them as
(status, ``error`` code). ``document(API)`` walks the ``Mount``'s routes, takes each route's path and methods
from Starlette and the rest from its endpoint's declaration, so the document cannot drift from the code the way
a hand-kept file would: a route without a declaration fails the build (and ``tests/server/relay/test_openapi.py``),
and that test also greps every ``Refusal`` code out of ``server/relay/*.py`` and asks the document for it.

A refusal is documented per status as a JSON object whose ``error`` is an ``enum`` of the codes the operation
may answer with that status; ``peertrain bench fuzz`` (``server.bench.fuzz``) holds the relay to it.
Starlette's ``SchemaGenerator`` (YAML after ``---`` in docstrings) was the other option: it keeps the schema in
free text that nothing checks, and it has no notion of an error code, which is what the fuzzer checks most.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from starlette.routing import Mount, Route

from runtime import wire

OPENAPI_VERSION = "3.1.0"
TITLE = "peertrain relay"
API_VERSION = "1"
JSON = "application/json"
OCTET = "application/octet-stream"  # wire messages (``runtime.wire``) and safetensors files
ATTRIBUTE = "__openapi__"  # where ``@operation`` keeps an endpoint's declaration

Auth = Literal["public", "peer", "admin", "model"]
Schema = Mapping[str, Any]
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])

OBJECT: Schema = {"type": "object"}
# What the relay's refusals look like; ``error`` is narrowed to an enum per operation and status.
REFUSAL_SCHEMA: Schema = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
}
SECURITY_SCHEMES: Schema = {
    "peer": {"type": "http", "scheme": "bearer", "bearerFormat": "<peer_id>:<token> from POST /api/join"},
    "admin": {"type": "http", "scheme": "bearer", "bearerFormat": "the relay's admin token"},
}
SECURITY: Mapping[Auth, list[dict[str, list[str]]]] = {
    "public": [],
    "peer": [{"peer": []}],
    "admin": [{"admin": []}],
    "model": [{}, {"admin": []}],  # anyone with ``serve --public-model``, else the admin
}
REASONS = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found", 405: "Method not allowed",
           408: "Request timeout", 409: "Conflict", 413: "Payload too large", 422: "Unprocessable content",
           429: "Too many requests", 503: "Unavailable"}
# What any request may meet besides an endpoint's own checks, listed on every operation: a head that does not
# arrive within serve's --header-timeout (``server.relay.limits``), a relay between two sessions
# (``POST /api/admin/session`` moving the old one's files; ``endpoints.relay_of``), and a write that fails
# for lack of disk space (``server.relay.storage``; most requests write, if only when a peer was last seen).
ANY_REQUEST_REFUSALS: tuple[tuple[int, str], ...] = ((408, "header_timeout"), (503, "replacing"), (503, "disk_full"))


@dataclass(frozen=True, kw_only=True)
class Param:
    """A query or path parameter."""

    name: str
    where: Literal["query", "path"] = "query"
    schema: Schema = field(default_factory=lambda: {"type": "string"})
    description: str = ""
    required: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "in": self.where, "required": self.required or self.where == "path",
                "description": self.description, "schema": dict(self.schema)}


@dataclass(frozen=True, kw_only=True)
class Body:
    """A request body: JSON with a schema, or binary (``application/octet-stream``)."""

    media_type: str = JSON
    schema: Schema = field(default_factory=lambda: dict(OBJECT))
    description: str = ""
    required: bool = False

    def to_json(self) -> dict[str, Any]:
        schema = dict(self.schema) if self.media_type != OCTET else {"type": "string", "format": "binary"}
        return {"required": self.required, "description": self.description,
                "content": {self.media_type: {"schema": schema}}}


@dataclass(frozen=True, kw_only=True)
class Answer:
    """A successful answer: its status and its body, by media type."""

    description: str
    content: Mapping[str, Schema] = field(default_factory=lambda: {JSON: OBJECT})
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)  # name -> description

    def to_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"description": self.description, "content": {
            media: {"schema": dict(schema) if media != OCTET else {"type": "string", "format": "binary"}}
            for media, schema in self.content.items()}}
        if self.headers:
            answer["headers"] = {name: {"description": text, "schema": {"type": "string"}}
                                 for name, text in self.headers.items()}
        return answer


@dataclass(frozen=True, kw_only=True)
class Operation:
    """What one endpoint function accepts and answers; ``refusals``: every (status, error code) it may refuse with."""

    summary: str
    auth: Auth = "public"
    params: Sequence[Param] = ()
    body: Body | None = None
    answers: Sequence[Answer] = ()
    refusals: Iterable[tuple[int, str]] = ()
    description: str = ""

    def refusal_codes(self) -> dict[int, list[str]]:
        """The refusals (and ``ANY_REQUEST_REFUSALS``) as status -> sorted codes."""
        by_status: dict[int, set[str]] = {}
        for status, code in (*self.refusals, *ANY_REQUEST_REFUSALS):
            by_status.setdefault(status, set()).add(code)
        return {status: sorted(codes) for status, codes in sorted(by_status.items())}

    def to_json(self, operation_id: str) -> dict[str, Any]:
        responses: dict[str, Any] = {str(answer.status): answer.to_json() for answer in self.answers}
        for status, codes in self.refusal_codes().items():
            responses[str(status)] = {
                "description": f"{REASONS.get(status, 'Refused')}: {', '.join(codes)}",
                "content": {JSON: {"schema": refusal_schema(codes)}},
            }
        entry: dict[str, Any] = {"operationId": operation_id, "summary": self.summary,
                                 "security": SECURITY[self.auth], "responses": responses}
        if self.description:
            entry["description"] = self.description
        if self.params:
            entry["parameters"] = [param.to_json() for param in self.params]
        if self.body is not None:
            entry["requestBody"] = self.body.to_json()
        return entry


def operation(declared: Operation) -> Callable[[Endpoint], Endpoint]:
    """Attach ``declared`` to an endpoint function (``document`` reads it from there)."""

    def attach(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, ATTRIBUTE, declared)
        return endpoint

    return attach


def declaration(endpoint: Callable[..., Any]) -> Operation:
    declared = getattr(endpoint, ATTRIBUTE, None)
    if not isinstance(declared, Operation):
        raise TypeError(f"endpoint {getattr(endpoint, '__qualname__', endpoint)!r} has no @operation declaration")
    return declared


def refusal_schema(codes: Sequence[str]) -> dict[str, Any]:
    properties: dict[str, Any] = {"error": {"type": "string", "enum": list(codes)}, "message": {"type": "string"}}
    if "join_rate" in codes:
        properties["ticket"] = {"type": "string", "description": "join_rate: shown with the next join (from "
                                "Retry-After on), it keeps this join's place in the address's queue"}
    return {**REFUSAL_SCHEMA, "properties": properties}


def wire_refusals() -> tuple[tuple[int, str], ...]:
    """Every ``runtime.wire.WireError`` a result message can fail with, as (status, code): the relay answers
    a message that fails a wire check with the error's own ``http_status`` and ``code`` (``server.relay.checks``)."""
    found: list[type[wire.WireError]] = []
    pending: list[type[wire.WireError]] = [wire.WireError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return tuple(sorted({(int(cls.http_status), cls.code) for cls in found if cls is not wire.WireError}))


def routes(mount: Mount) -> list[tuple[str, list[str], Callable[..., Any]]]:
    """(OpenAPI path, methods, endpoint function) for each route of ``mount``, in order."""
    found = []
    for route in mount.routes:
        if not isinstance(route, Route):
            raise TypeError(f"{route!r} under {mount.path} is not a Route; the OpenAPI document cannot describe it")
        path = mount.path + route.path_format  # "/unit/{index}" (a convertor's ":int" is not in path_format)
        found.append((path, sorted(route.methods or ("GET",)), route.endpoint))
    return found


def document(mount: Mount, *, server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI document of every route under ``mount``. A path that two routes share (one method each) is one
    path item; the first route that takes a method answers it, as in Starlette."""
    paths: dict[str, dict[str, Any]] = {}
    for path, methods, endpoint in routes(mount):
        declared = declaration(endpoint)
        item = paths.setdefault(path, {})
        for method in methods:
            name = method.lower()
            if name in item:
                continue
            operation_id = endpoint.__name__ if name in ("get", "post") else f"{endpoint.__name__}_{name}"
            item[name] = declared.to_json(operation_id)
    built: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": TITLE, "version": API_VERSION, "description": (
            "The relay's session API. Refusals answer their 4xx status with a JSON object "
            '{"error": code, "message": text}; the codes of each operation and status are the enum of its '
            "error field. Weights, chunks and results are binary wire messages (runtime.wire), the model a "
            "safetensors file, both application/octet-stream.")},
        "paths": paths,
        "components": {"securitySchemes": dict(SECURITY_SCHEMES), "schemas": {"Refusal": dict(REFUSAL_SCHEMA)}},
    }
    if server_url is not None:
        built["servers"] = [{"url": server_url}]
    return built


def documented_codes(built: Mapping[str, Any]) -> dict[tuple[str, str], dict[int, set[str]]]:
    """(method, path) -> status -> error codes of its refusals, read back from a built document (the tests and
    the fuzzer)."""
    codes: dict[tuple[str, str], dict[int, set[str]]] = {}
    for path, item in built["paths"].items():
        for method, entry in item.items():
            by_status = codes.setdefault((method.upper(), path), {})
            for status, response in entry["responses"].items():
                schema = response.get("content", {}).get(JSON, {}).get("schema", {})
                enum = schema.get("properties", {}).get("error", {}).get("enum")
                if int(status) >= 400 and enum is not None:
                    by_status[int(status)] = set(enum)
    return codes
