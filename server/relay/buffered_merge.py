"""The asynchronous buffer's merge (``AsyncBuffer.merge_blocking``, in a worker thread): the oldest K buffered
results, none held for a replay or a copy, into the next version.

The results are marked merged in the store before the checkpoint is written (``server.relay.buffered``'s crash
safety). Each counts as ``current + (1 + s) ** -a * update`` for its staleness s. Where the session's aggregator
streams (``runtime.aggregate.streaming``), the sum the results were added to as they arrived (``ArrivalSums``) is
taken as it is, the few that came while it was closed added now, and no more than a few results are in memory at a
time; an aggregator that needs every result at once gets the K of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.aggregate.streaming import STREAMED, Stream
from runtime.tasks import UnitResult
from server.relay.arrival_checks import ArrivalChecks
from server.relay.open_sum import ArrivalSums
from server.relay.store import Store
from server.session.buffered import effective_weights, stored_update, validates
from server.session.session import Session
from server.session.streamed import add_all


def merge_oldest(session: Session, store: Store, sums: ArrivalSums, checks: ArrivalChecks) -> dict[str, Any]:
    """Merge the oldest K results of ``store``'s buffer, none that ``checks`` hold, into the session's next version,
    with ``sums``, the next merge's sum as the results arrived (closed here); the checkpoint's entry."""
    k = session.plan.participants_per_round
    merge = session.round
    with sums.lock:  # (arrivals from now on wait for the next merge's sum; a ban's removal for the marks)
        opened, sums.open = sums.open, None
        held = checks.held_seqs()  # (waiting for a replay: a ban may have moved one among the oldest)
        rows = [row for row in store.buffered(k + len(held)) if row[0] not in held][:k]
        if rows:
            checks.passed_over(rows[-1][0])
        store.mark_merged([row[0] for row in rows], merge)  # before the checkpoint (module docstring)
    validate = validates(merge, session.config.validate_every, session.num_rounds)
    extra = {"staleness": [merge - row[3] for row in rows], "started_from": [row[3] for row in rows],
             "entries": [row[1] for row in rows], "staleness_exponent": session.config.staleness_exponent}
    position = {row[0]: index for index, row in enumerate(rows)}
    stream: Stream | None
    if opened is not None and opened.merge == merge and opened.weights is session.weights and \
            opened.seqs <= position.keys():  # (the results summed as they came, keyed by position now)
        stream = opened.stream
        stream.rekey({seq: position[seq] for seq in opened.seqs})
    else:  # (a sum that is gone stale: a rewind replaced the weights)
        stream, opened = session.open_stream(), None
    current = session.weights if stream is None else stream.global_weights  # (the same values; float64 once)

    def effective(index: object) -> np.ndarray:  # (row ``index`` as the merge sees it)
        _, _, _, version, _, _, update, message = rows[int(index)]  # type: ignore[call-overload]
        return effective_weights(current, stored_update(message, update, session.config.result_codec),
                                 merge - version, session.config.staleness_exponent)
    if stream is None:  # (an aggregator that needs every result at once: K of them in memory)
        results = [(row[2], UnitResult(effective(index), row[4], row[5])) for index, row in enumerate(rows)]
        entry = session.complete_buffer(results, validate=validate, extra=extra)
    else:  # a few results in memory at a time: the same bits (runtime.aggregate.streaming), O(n) beside them
        add_all(stream, [(index, row[4]) for index, row in enumerate(rows)  # (those that came during a merge)
                         if opened is None or row[0] not in opened.seqs], effective)
        entry = session.complete_buffer([(row[2], UnitResult(STREAMED, row[4], row[5])) for row in rows],
                                        validate=validate, extra=extra, streamed=(stream, effective))
    return entry
