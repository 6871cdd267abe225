"""MkDocs hooks for the documentation site (mkdocs.yml).

- The HTTP API page gets the relay's reference: ``docs/api.md`` holds a marker where the reference of every
  endpoint goes, rendered from the same OpenAPI document the relay serves at ``/api/openapi.json``
  (``server.relay.openapi_markdown``), so the page cannot drift from the routes.
- The README and BENCHMARKS.md live at the repository's root (where a newcomer looks first) and are pages of the
  site through include-markdown; a link to either, from any page, goes to its page on the site.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

MARKER = "<!-- openapi reference -->"
ROOT_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks/index.md"}  # repository file -> site page
LINK = re.compile(r"\]\(((?:\.\./)+)(README\.md|BENCHMARKS\.md)(#[^)]*)?\)")


def root_links(markdown: str, page_path: str) -> str:
    """``](../BENCHMARKS.md)`` (as many ``../`` as lead out of docs/) -> a link to the file's page."""
    depth = page_path.count("/") + 1  # docs/ itself is one level below the repository's root

    def replace(match: re.Match[str]) -> str:
        if len(match.group(1)) // 3 != depth:
            return match.group(0)
        target = posixpath.relpath(ROOT_PAGES[match.group(2)], posixpath.dirname(page_path) or ".")
        return f"]({target}{match.group(3) or ''})"

    return LINK.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = root_links(markdown, page.file.src_uri)
    if MARKER in markdown:
        from server.relay.openapi_markdown import relay_reference

        markdown = markdown.replace(MARKER, relay_reference())
    return markdown
