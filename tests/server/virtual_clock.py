"""A virtual "now" for the store and relay tests (a store reads every timestamp from the clock it was opened with)."""

from __future__ import annotations


class Clock:
    """A virtual "now" a test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
