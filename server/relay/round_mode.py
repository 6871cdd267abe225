"""What the relay asks of its round mode (``RoundMode``): synchronous rounds (``server.relay.rounds.SyncRounds``) or
buffered asynchronous merging (``server.relay.buffered.AsyncBuffer``).

A round mode is the policy of one session: how work is handed out, how a result is judged against the round (or
version) it names, when the open round (or the buffer) may merge, and the merge itself. The relay
(``server.relay.state.Relay``) owns one and calls nothing else on it; everything around those calls (pausing, a full
disk, counting, notices, scheduling the merge, undos, replays' verdicts) is the relay's. A new session brings a new
mode (its settings may name the other one). The rules every mode keeps: docs/liveness.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from runtime.protocol import WorkAnswer
from server.relay.checks import EarlyRead
from server.relay.store import StoredResult
from server.relay.verify import Verdict

SPARE_TURNS = 8  # held requests a merge wakes beyond the units it makes (``units_open``): a refused slot, a backup


class RoundMode(Protocol):
    @property
    def hands_out_while_merging(self) -> bool:
        """Whether a peer is handed work while a merge runs. Synchronous rounds: no (the next round is not open
        until the merge ends; a peer is told to wait). Async: yes (a peer trains from the version it is handed)."""
        ...

    def next_job(self, peer_id: str) -> WorkAnswer:
        """The peer's next ``Job`` (with a lease), or a ``Wait`` when nothing is open to it now. Called
        only while the session runs, is not paused, the disk has room and (see ``hands_out_while_merging``) no
        merge forbids it; a peer that holds a live lease is handed the same job again."""
        ...

    def reader(self, peer_id: str, round_index: int, slot: int, body: bytes) -> Callable[[], EarlyRead] | None:
        """What of ``accept`` may be done in a worker thread as the result arrives, before ``accept`` runs on the event
        loop: decoding it and whatever else reads nothing the loop changes (``EarlyRead``). None: nothing (``accept``
        does it all, or refuses)."""
        ...

    def accept(self, peer_id: str, round_index: int, slot: int, body: bytes,
               early: EarlyRead | None = None) -> StoredResult:
        """Check a result of ``(round_index, slot)`` (async: version and schedule entry) against its lease and the
        round, store it and keep what the merge needs (``early``: what ``reader``'s function read, used while the
        weights it read against are still the ones). Raises a ``Refusal`` naming what is wrong; the relay counts it
        either way and schedules a merge after an accepted one."""
        ...

    def awaited(self, round_index: int, slot: int) -> bool:
        """Whether a merge waits for a result of ``slot`` (async: the copy of an arrival held for it, a dispute's
        next result; its upload takes a turn before others). Synchronous rounds: no (every result of a round is)."""
        ...

    def holds_unit(self, peer_id: str, unit_index: int) -> bool:
        """Whether ``peer_id`` holds a live lease on ``unit_index`` (it may fetch the unit's data)."""
        ...

    def ready(self) -> bool:
        """Whether the open round (async: the buffer) may merge now. Never True once the session is done."""
        ...

    def units_open(self) -> int | None:
        """After a merge: how many held requests for work may find some (``Notices.work_changed``), ``SPARE_TURNS``
        included; None: all of them look (a session that ended)."""
        ...

    def merge_blocking(self) -> dict[str, Any]:
        """Merge what is ready into the next weights, checkpointed by the session, and return the history entry.
        Runs in a worker thread (or inline without an event loop) while the relay says it is merging."""
        ...

    def waiting(self) -> str | None:
        """What the round (async: the stream) waits for, in words for the page (None: a peer asking now is handed
        something)."""
        ...

    def progress(self) -> dict[str, int]:
        """The status's ``round_progress``: at least ``slots``, ``done``, ``leased`` and ``copies``. Read while a merge
        may move the round on in its worker thread: it must not fail on a round the plan no longer has."""
        ...

    def weights_of_version(self, version: int) -> bytes | None:
        """The wire message of weights ``version`` other than the current ones, where the mode keeps them (a job
        names the weights it was handed); None when they are not kept."""
        ...

    def settle(self, verdicts: list[Verdict]) -> None:
        """Replays' verdicts are in, applied by the relay (a failed one has banned its peer): what they judged goes on
        (a dispute's copies; async: the results held for their replay may merge)."""
        ...

    def banned(self, peer_id: str) -> None:
        """A peer was banned (``server.relay.bans``, which drops its results of a synchronous round): async, its results
        still in the buffer go."""
        ...

    def restarted(self) -> None:
        """This relay holds the session after a restart or a takeover: what the relay before had pending goes on
        (a synchronous round's copies settle; async, the arrivals a check held wait for it again)."""
        ...

    def follow(self, between: dict[int, np.ndarray]) -> None:
        """A replica took on a newer checkpoint (``server.relay.sharing``): keep its weights, and ``between``'s, the
        versions merged since the last one that results may have started from."""
        ...
