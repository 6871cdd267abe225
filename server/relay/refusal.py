"""``Refusal``: how the relay says no. Every refusal is a documented 4xx with a code (README, "Refusals")."""

from __future__ import annotations

from collections.abc import Mapping


class Refusal(Exception):
    """A request the relay refuses: the HTTP ``status``, a stable ``code``, a message for people, and extra
    response headers (``Retry-After`` on a 429)."""

    def __init__(self, status: int, code: str, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})
        self.counted = False  # by the relay's API (``Relay.count_refusal``); the HTTP handler counts the rest
