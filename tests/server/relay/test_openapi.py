"""``GET /api/openapi.json``: the API's OpenAPI document, built from ``endpoints.API`` and the endpoints' declarations.

The document must list every route and method of ``endpoints.API`` and every ``Refusal`` code the relay raises:
the codes are grepped out of ``server/relay/*.py`` here, so adding a code without declaring it fails this test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from relay_fixtures import ADMIN_TOKEN, REPO_ROOT, HttpPeer, build_small_package, make_relay, serving

from runtime import wire
from server.relay import endpoints, openapi
from server.session.config import SETTABLE

RELAY_SOURCES = sorted((REPO_ROOT / "server" / "relay").glob("*.py"))
# Refusal(409, "duplicate", ...), the status and code literal, possibly on the next line after "Refusal(".
REFUSAL_PATTERN = re.compile(r"\bRefusal\(\s*(\d{3})\s*,\s*[\"']([a-z_]+)[\"']")


def raised_refusals() -> set[tuple[int, str]]:
    found = set()
    for path in RELAY_SOURCES:
        found |= {(int(status), code) for status, code in REFUSAL_PATTERN.findall(path.read_text())}
    return found


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return openapi.document(endpoints.API)


def test_the_grep_finds_the_refusals() -> None:
    """The pattern itself: it finds codes in several modules (so it did not silently match nothing)."""
    found = raised_refusals()
    assert {(401, "unauthorized"), (409, "duplicate"), (429, "join_rate"), (422, "bad_session"),
            (422, "update_norm")} <= found
    assert len(found) >= 25


def test_every_route_and_method_is_documented(document: dict[str, Any]) -> None:
    for route in endpoints.API.routes:
        path = endpoints.API.path + route.path_format  # type: ignore[attr-defined]
        assert path in document["paths"], path
        for method in route.methods:  # type: ignore[attr-defined]
            entry = document["paths"][path][method.lower()]
            assert entry["summary"] and entry["responses"], (method, path)
            assert any(200 <= int(status) < 300 for status in entry["responses"]), (method, path)
    documented = {(m.upper(), p) for p, item in document["paths"].items() for m in item}
    served = {(m, endpoints.API.path + r.path_format) for r in endpoints.API.routes for m in r.methods}  # type: ignore
    assert documented == served


def test_every_refusal_code_raised_in_the_relay_is_documented_with_its_status(document: dict[str, Any]) -> None:
    documented = {(status, code) for by_status in openapi.documented_codes(document).values()
                  for status, codes in by_status.items() for code in codes}
    missing = raised_refusals() - documented
    assert not missing, f"Refusal codes raised in server/relay but not declared on any endpoint: {sorted(missing)}"


def test_every_wire_error_is_documented_for_results(document: dict[str, Any]) -> None:
    """A result that fails a wire check is refused with the error's own status and code (server.relay.checks)."""
    result = openapi.documented_codes(document)[("POST", "/api/result")]
    for cls in [wire.TruncatedMessage, wire.BadMagic, wire.MalformedHeader, wire.NonFiniteWeights,
                wire.ShapeMismatch, wire.StaleRound, wire.FingerprintMismatch]:
        assert cls.code in result[cls.http_status], cls
    assert {code for status, code in openapi.wire_refusals()} >= {"truncated", "length_mismatch", "dtype_mismatch"}


def test_refusals_are_json_with_an_error_enum(document: dict[str, Any]) -> None:
    for path, item in document["paths"].items():
        for method, entry in item.items():
            for status, response in entry["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema["required"] == ["error", "message"], (method, path, status)
                    assert schema["properties"]["error"]["enum"], (method, path, status)


def test_binary_bodies_are_octet_streams(document: dict[str, Any]) -> None:
    paths = document["paths"]
    assert "application/octet-stream" in paths["/api/result"]["post"]["requestBody"]["content"]
    for path in ("/api/weights", "/api/unit/{index}", "/api/model", "/api/admin/export/{what}"):
        assert "application/octet-stream" in paths[path]["get"]["responses"]["200"]["content"], path


def test_peer_and_admin_operations_declare_their_security(document: dict[str, Any]) -> None:
    paths = document["paths"]
    assert paths["/api/work"]["post"]["security"] == [{"peer": []}]
    assert paths["/api/admin/peers"]["get"]["security"] == [{"admin": []}]
    assert paths["/api/session"]["get"]["security"] == []
    assert set(document["components"]["securitySchemes"]) == {"peer", "admin"}


def test_the_session_body_names_every_settable_setting(document: dict[str, Any]) -> None:
    body = document["paths"]["/api/admin/session"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == set(SETTABLE) | {"replace"}


def test_an_endpoint_without_a_declaration_fails_the_build() -> None:
    from starlette.routing import Mount, Route

    async def undeclared(request: object) -> None: ...

    with pytest.raises(TypeError, match="no @operation declaration"):
        openapi.document(Mount("/api", routes=[Route("/x", undeclared)]))


def test_served_document_and_json_refusals_for_unrouted_paths(tmp_path: Path) -> None:
    relay = make_relay(build_small_package(tmp_path / "package"), tmp_path / "session")
    with serving(relay) as client:
        served = client.get("/api/openapi.json")
        assert served.status_code == 200 and served.json() == json.loads(json.dumps(openapi.document(endpoints.API)))
        peer = HttpPeer(client)  # type: ignore[arg-type]  # (a TestClient speaks httpx.Client's interface)
        # Paths and methods no route takes: JSON refusals with a code under /api, plain text elsewhere.
        missing = client.get("/api/nothing-here")
        assert (missing.status_code, missing.json()["error"]) == (404, "not_found")
        wrong_method = client.delete("/api/session")
        assert (wrong_method.status_code, wrong_method.json()["error"]) == (405, "method_not_allowed")
        assert client.get("/nothing-here").headers["content-type"].startswith("text/plain")
        # A unit index that is not a short ASCII number: 404 unknown_unit (a 5000-digit one was a 500).
        for index in ("9" * 5000, "-1", "abc", "\u0663"):
            answer = client.get(f"/api/unit/{index}", headers=peer.headers)
            assert (answer.status_code, answer.json()["error"]) == (404, "unknown_unit"), index
        assert client.get("/api/unit/0", headers=peer.headers).json()["error"] == "not_leased"
        admin = client.get("/api/admin/peers", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert admin.status_code == 200


def test_deeply_nested_json_is_a_bad_json_refusal(tmp_path: Path) -> None:
    """``json.loads`` raises RecursionError (not a ValueError) a few thousand levels deep: it was a 500."""
    relay = make_relay(build_small_package(tmp_path / "package"), tmp_path / "session")
    with serving(relay) as client:
        answer = client.post("/api/join", content=b"[" * 4000)
        assert (answer.status_code, answer.json()["error"]) == (400, "bad_json")
        answer = client.post("/api/admin/session", content=b'{"a":' * 10000,
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert (answer.status_code, answer.json()["error"]) == (400, "bad_json")
