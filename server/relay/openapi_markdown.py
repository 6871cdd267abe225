"""The relay's OpenAPI document as a Markdown reference (the documentation site's "HTTP API" page).

The page is built from ``openapi.document(API)`` when the site is built (``scripts/mkdocs_hooks.py``), so, like
``GET /api/openapi.json``, it cannot drift from the routes: one section per path, one table per method with who
may call it, its parameters, its body and every answer with its refusal codes. HEAD, which Starlette answers for
every GET, is listed once beside the GET it mirrors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.relay.openapi import JSON

WHO = {"peer": "a peer (its `Bearer <peer_id>:<token>` from `POST /api/join`)",
       "admin": "the admin (`Bearer` the relay's admin token)"}


def cell(text: str) -> str:
    """Text fit for one table cell: no line breaks, no bare pipes, no ``<`` read as HTML outside code spans."""
    parts = " ".join(str(text).split()).replace("|", "\\|").split("`")
    return "`".join(part if index % 2 else part.replace("<", "&lt;") for index, part in enumerate(parts))


def sentence(text: str) -> str:
    text = cell(text)
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def schema_words(schema: Mapping[str, Any]) -> str:
    """A parameter's schema in a few words: its type, bounds, pattern or choices."""
    words = [str(schema.get("type", "any"))]
    if "enum" in schema:
        words.append("one of " + ", ".join(f"`{value}`" for value in schema["enum"]))
    for key, word in (("minimum", ">="), ("maximum", "<="), ("exclusiveMinimum", ">")):
        if key in schema:
            words.append(f"{word} {schema[key]}")
    if "pattern" in schema:
        words.append(f"`{schema['pattern']}`")
    return ", ".join(words)


def who_may_call(security: list[Mapping[str, Any]]) -> str:
    if not security:
        return "anyone"
    names = [name for requirement in security for name in requirement] or ["anyone"]
    if security and not security[0]:  # ``[{}, {"admin": []}]``: anyone where the host allows it, else the admin
        return "anyone with `serve --public-model`, else the admin"
    return " or ".join(WHO.get(name, name) for name in names)


def refusal_codes(response: Mapping[str, Any]) -> list[str]:
    schema = response.get("content", {}).get(JSON, {}).get("schema", {})
    return list(schema.get("properties", {}).get("error", {}).get("enum", []))


def operation_markdown(method: str, path: str, operation: Mapping[str, Any], *, also_head: bool) -> list[str]:
    title = f"`{method.upper()} {path}`" + (" (and `HEAD`)" if also_head else "")
    lines = [f"### {title}", "", sentence(operation.get("summary", "")), ""]
    if operation.get("description"):
        lines += [cell(operation["description"]), ""]
    lines += [f"Who may call it: {who_may_call(operation.get('security', []))}.", ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | required | takes | what it is |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} | "
                  f"{cell(schema_words(p.get('schema', {})))} | {cell(p.get('description', ''))} |" for p in parameters]
        lines.append("")
    body = operation.get("requestBody")
    if body:
        kinds = ", ".join(f"`{kind}`" for kind in body.get("content", {}))
        lines += [f"Body ({kinds}): {sentence(body.get('description', ''))}", ""]
    lines += ["| status | answer | refusal codes (`error`) |", "| --- | --- | --- |"]
    for status, response in operation.get("responses", {}).items():
        codes = refusal_codes(response)
        description = response.get("description", "")
        if codes:
            description = description.split(":", 1)[0]
        lines.append(f"| {status} | {cell(description)} | {', '.join(f'`{code}`' for code in codes)} |")
    return [*lines, ""]


def reference(document: Mapping[str, Any]) -> str:
    """Every path and method of an OpenAPI document, as Markdown (headings from level 2)."""
    lines = [document["info"].get("description", ""), ""]
    for path, item in document["paths"].items():
        lines += [f"## `{path}`", ""]
        for method, operation in item.items():
            if method == "head" and "get" in item:
                continue
            lines += operation_markdown(method, path, operation, also_head=method == "get" and "head" in item)
    return "\n".join(lines).rstrip("\n") + "\n"


def relay_reference() -> str:
    """The reference of the relay's own API (``server.relay.endpoints.API``)."""
    from server.relay import openapi
    from server.relay.endpoints import API

    return reference(openapi.document(API))
