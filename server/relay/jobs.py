"""What a peer is handed (``Jobs``): an assignment as the ``runtime.protocol.Job`` of ``POST /api/work``, and the
weights it starts from as wire messages.

Weights are named by the sha256 of their bytes (``runtime.deltas.weights_sha256``). A job names its weights
(``weights_digest``, ``weights_url``); ``GET /api/weights/<digest>`` is the full message and
``GET /api/weights/<digest>/from/<held>`` the chain of compressed steps from the weights a peer holds (sessions
with a compressing codec, ``server.session.downloads``). Both never change, so any HTTP cache may keep them.
The messages are encoded once per version and kept while the version is served."""

from __future__ import annotations

import numpy as np

from runtime import deltas, wire
from runtime.planner import Assignment
from runtime.protocol import Job
from server.relay.context import RelayContext

CHAINS_KEPT = 8  # encoded chain messages kept (most peers ask for the same one: from the last round's weights)


class Jobs:
    def __init__(self, context: RelayContext) -> None:
        self.context = context
        # (round, weights, message, digest) of the current weights: kept while the session's round and weights array
        # stay (``current``)
        self._current: tuple[int, np.ndarray, bytes, str] | None = None
        # Older versions a job may still name (async mode keeps the recent ones: ``AsyncBuffer.keep_version``).
        self.kept: dict[int, np.ndarray] = {}
        self._digests: dict[int, str] = {}  # version -> digest of a kept version
        self._chains: dict[tuple[str, str], bytes | None] = {}  # (from, to) -> chain message (None: too long)

    def job(self, assignment: Assignment, deadline: float) -> Job:
        """The job of ``assignment``, leased until ``deadline`` (the store's clock)."""
        session, store = self.context.session, self.context.store
        unit = session.work_unit(assignment)
        digest = self.digest_of(assignment.round)
        codec = session.config.result_codec
        return Job(round=assignment.round, slot=assignment.slot, pass_index=assignment.pass_index,
                   unit_index=assignment.unit_index, unit_seed=assignment.unit_seed, kind=session.task.kind,
                   episodes=unit.episodes, progress=unit.progress,
                   lease_deadline=deadline, lease_seconds=max(0.0, deadline - store.clock()),
                   weights_round=assignment.round, num_rounds=session.num_rounds,
                   fingerprint=self.context.package.fingerprint,
                   weights_digest=digest, weights_url=f"/api/weights/{digest}" if digest else None,
                   carried_from=session.carried_from(assignment),
                   codec=codec.to_json() if codec.compresses else None)

    def current(self) -> tuple[int, bytes, str]:
        """(round, weights message, digest) of the current weights, encoded once per round and weights. Where the
        current version is kept (async mode: ``AsyncBuffer.keep_version``), its kept copy: a merge in its worker
        thread holds the merged weights a moment before it counts the version, and async mode hands out jobs (and
        serves weights) meanwhile, so the session's weights then are the next version's, not this one's."""
        session = self.context.session
        round_index = session.round
        weights = self.kept.get(round_index)
        if weights is None:
            weights = session.weights
        kept = self._current
        if kept is None or kept[0] != round_index or kept[1] is not weights:
            kept = self._current = (round_index, weights, self.message(weights, round_index),
                                    deltas.weights_sha256(weights))
        return kept[0], kept[2], kept[3]

    def weights_message(self) -> bytes:
        """The current round's weights as a wire message (cached until the round changes)."""
        return self.current()[1]

    def digest_of(self, version: int) -> str | None:
        """The digest of the current weights or of a kept version; None for a version not served."""
        if version == self.context.session.round:
            return self.current()[2]
        weights = self.kept.get(version)
        if weights is None:
            return None
        if version not in self._digests:
            self._digests = {v: d for v, d in self._digests.items() if v in self.kept}
            self._digests[version] = deltas.weights_sha256(weights)
        return self._digests[version]

    def version_named(self, digest: str) -> int | None:
        """The version (newest first) whose weights ``digest`` names, among those served."""
        for version in sorted({self.context.session.round, *self.kept}, reverse=True):
            if self.digest_of(version) == digest:
                return version
        return None

    def named(self, digest: str) -> bytes | None:
        """The full weights message ``digest`` names (the current weights or a kept version), or None."""
        version = self.version_named(digest)
        if version is None:
            return None
        return self.weights_message() if version == self.context.session.round else \
            self.message(self.kept[version], version)

    def chain(self, digest: str, held: str) -> bytes | None:
        """The chain message from the weights named ``held`` to those named ``digest`` (served ones), or None when
        the session keeps no such chain (no compressing codec, a restart, too long ago) or it is no smaller than
        the full message."""
        key = (held, digest)
        if key in self._chains:
            return self._chains[key]
        session = self.context.session
        version = self.version_named(digest)
        links = session.downloads.log.chain(held, digest) if version is not None else None
        if not links or sum(len(s.payload) for s in links) >= len(self.weights_message()):
            return None
        message: bytes | None = deltas.encode_chain(links, spec=session.spec, codec=session.downloads.codec,
                                                    fingerprint=self.context.package.fingerprint,
                                                    round_index=version or 0)
        if message is not None and len(message) >= len(self.weights_message()):  # (the links' header counts too)
            message = None
        self._chains[key] = message
        while len(self._chains) > CHAINS_KEPT:
            self._chains.pop(next(iter(self._chains)))
        return message

    def message(self, weights: np.ndarray, round_index: int) -> bytes:
        header = wire.WireHeader(spec=self.context.session.spec, round=round_index,
                                 fingerprint=self.context.package.fingerprint, num_examples=0)
        return wire.encode(weights, header)

    def forget(self) -> None:
        """A new session (or the last checkpoint reloaded): the cached messages may be of other weights."""
        self._current = None
        self.kept.clear()
        self._digests.clear()
        self._chains.clear()
