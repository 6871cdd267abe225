"""The open round's sums, from the relay's side (``RoundSums``): when a synchronous round opens its sum, rebuilds it
from SQLite after a result left it, and reads a stored result's weights again. The sums themselves live in the
``RoundBook`` (``server.relay.book``); the arithmetic in ``runtime.aggregate.streaming``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from server.relay.book import RoundBook
from server.relay.checks import decode_result
from server.relay.context import RelayContext
from server.relay.store import StoredResult
from server.session.config import SessionError


class RoundSums:
    def __init__(self, context: RelayContext, book: RoundBook) -> None:
        self.context, self.book = context, book

    def prepare(self, round_index: int) -> None:
        """Before a result of ``round_index`` is kept: its first result opens the round's sum (when the session's
        aggregator streams); a round whose sums went stale (a result dropped) has them rebuilt from what is stored.
        A round that had results before the relay started is merged from SQLite."""
        book, store, session = self.book, self.context.store, self.context.session
        if book.stale(round_index):
            store.count("round_sums_rebuilt")  # (O(k n): every stored result of the round decoded again)
            stored = store.results(round_index)
            book.rebuild(round_index, session.open_stream(),
                         [(result, self.decoded(result)) for _, result in sorted(stored.items())])
        elif book.stream(round_index) is None and not store.result_slots(round_index):  # (its first result)
            book.open_stream(round_index, session.open_stream())

    def decoded(self, result: StoredResult) -> np.ndarray:
        """A stored result's weights (its message decoded against the current weights)."""
        return decode_result(result.message, session=self.context.session, round_index=result.round)[1]

    def reread(self, round_index: int) -> Callable[[object], np.ndarray]:
        """A slot's stored weights again (a streamed merge's second look at a result beyond its radius)."""
        def reread(slot: object) -> np.ndarray:
            result = self.context.store.result(round_index, int(slot))  # type: ignore[call-overload]
            if result is None:
                raise SessionError(f"slot {slot} of round {round_index} was summed but is not stored")
            return self.decoded(result)
        return reread
