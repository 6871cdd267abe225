"""``Refusal``: how the relay says no. Every refusal is a documented 4xx with a code (docs/api.md)."""

from __future__ import annotations

from collections.abc import Mapping


class Refusal(Exception):
    """A request the relay refuses: the HTTP ``status``, a stable ``code``, a message for people, and extra
    response headers (``Retry-After`` on a 429) and fields the body carries beside ``error`` and ``message`` (a
    join's ``ticket``)."""

    def __init__(self, status: int, code: str, message: str, *, headers: Mapping[str, str] | None = None,
                 body: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})
        self.body = dict(body or {})
        self.counted = False  # by the relay's API (``Relay.count_refusal``); the HTTP handler counts the rest

    def to_json(self) -> dict[str, str]:
        """The response body: ``{"error": code, "message": ..., **body}``."""
        return {**self.body, "error": self.code, "message": self.message}
