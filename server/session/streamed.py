"""A round summed as its results arrived (``runtime.aggregate.streaming``), on the session's side: when a session can
take its results that way, the check that the sum holds the results the round completes with, and the merge from
the sum. The relay opens the sum when a round's first result arrives (``server.relay.book``); the simulator, a
restart and a ban's undo merge the same results at once, which gives the same bits."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from runtime.aggregate.streaming import STREAMED, Contribution, Reread, Stream
from server.session.settings import SessionError

Session = Any  # server.session.session.Session (which imports this module)
Streamed = tuple[Stream, Reread]  # a round's sum, and a way to read a slot's weights again
SUM_WORKERS = min(4, os.cpu_count() or 1)  # threads that compute results' parts of a sum at once (``add_all``)


def add_all(stream: Stream, results: Sequence[tuple[Hashable, int]], weights_of: Callable[[Hashable], np.ndarray],
            workers: int = SUM_WORKERS) -> None:
    """Add results (key, example count; ``weights_of(key)`` reads a result's weights) to ``stream``, their parts
    computed in ``workers`` threads (NumPy lets go of the GIL) and added in the order given: the same sum as adding
    them one by one. At most two parts per worker are in hand at once (each holds one or two int64 vectors)."""
    if workers <= 1 or len(results) <= 1:
        for key, count in results:
            stream.add(key, weights_of(key), count)
        return

    def prepare(key: Hashable, count: int) -> Contribution:
        return stream.prepare(weights_of(key), count)

    pending: deque[tuple[Hashable, Future[Contribution]]] = deque()

    def add_oldest() -> None:
        key, part = pending.popleft()
        contribution = part.result()
        stream.add(key, STREAMED, contribution.count, contribution)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="merge-sum") as pool:
        for key, count in results:
            pending.append((key, pool.submit(prepare, key, count)))
            if len(pending) >= 2 * workers:
                add_oldest()
        while pending:
            add_oldest()


def open_stream(session: Session) -> Stream | None:
    """A sum of the session's current round as its results arrive, when the merge can take them one at a time: an
    aggregator that streams and no central privacy stage (which clips and noises the round as a whole). None
    otherwise: the results are then kept to the merge. Opened from the weights and the aggregator's state of now,
    so it belongs to this round only (a rewind or a merge makes it stale)."""
    if session.privacy is not None or not session.aggregator.streams():
        return None
    return session.aggregator.open_stream(session.weights.astype(np.float64))


def check_sum(round_index: int, stream: Stream, given: Mapping[int, int]) -> None:
    """The sum holds exactly the round's results (``given``: key -> example count), with their example counts."""
    summed = {int(slot): count for slot, count in stream.counts.items()}  # type: ignore[call-overload]
    if summed != given:
        raise SessionError(f"round {round_index}'s sum holds slots and examples {sorted(summed.items())}, its "
                           f"results are {sorted(given.items())}")


def merged_from_sum(session: Session, streamed: Streamed, slots: Sequence[int]) -> np.ndarray:
    """The new weights from the round's sum; the aggregator's ``last_outliers`` are the clipped results' positions
    among ``slots`` (the round's results in slot order), as after a merge of the results themselves."""
    stream, reread = streamed
    average, clipped = session.aggregator.finish_stream(stream, reread)
    position = {slot: index for index, slot in enumerate(slots)}
    session.aggregator.last_outliers = tuple(sorted(position[key] for key in clipped))  # type: ignore[index]
    return np.asarray(session.merge.merge_average(session.weights, average))
