"""Weights downloads as chains of compressed steps: what the relay sends a peer that already holds older weights.

After every merge the relay does not move the global weights to the merged ones directly: it encodes the merged
*step* (merged minus the weights before) with the session's codec (``runtime.codecs``) and adds exactly the decoded
step, in float32 (``Session``'s downloads, ``server.session.downloads``). So the weights of round r are, bit for
bit, the weights of round r-1 plus a step anyone holding the payload can decode: a peer that holds round r-1 rebuilds
round r from a few hundred kilobytes instead of the whole float32 vector.

Weights are named by the sha256 of their float32 little-endian bytes (``weights_sha256``, 64 hex digits): the
relay's content-addressed URLs, and the check a peer makes after every step it applies.

Chain message layout: the framing of ``runtime.wire`` with magic b"PTD2", the header::

    {"spec": {...}, "fingerprint": "9f2c...", "round": 7, "codec": {"name": "int8", "block": 256},
     "from": "<sha256 of the weights the chain starts at>", "to": "<sha256 of the weights it ends at>",
     "links": [{"round": 6, "base": "<sha256>", "digest": "<sha256>", "bytes": 590084}, ...]}

and the links' codec payloads one after the other, oldest first. ``round`` is the round the final weights are the
weights of; link ``i`` takes the weights named ``base`` to the weights named ``digest`` (the next link's base). A
chain that does not start at the weights the peer holds is refused (``WrongBase``), and a link whose result is not the
weights it names (``ChainMismatch``): the peer then fetches the full weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime import wire
from runtime.codecs import Codec, CodecError, ErrorFeedback
from runtime.codecs import from_json as codec_from_json
from runtime.weights import WeightSpec

CHAIN_MAGIC = b"PTD2"
MAX_LINKS = 64  # a relay keeps at most this many steps (and never more bytes than one full weights message)


class ChainMismatch(wire.WireError):
    """Weights rebuilt from a chain are not the weights it names (the relay's steps and the peer's arithmetic
    disagree, or the chain was altered): the peer fetches the full weights instead."""

    code = "chain_mismatch"
    http_status = 422


weights_sha256 = wire.weights_sha256  # (defined beside the update messages' shorter digest)


@dataclass(frozen=True)
class Step:
    """One merge's compressed step: it takes the weights named ``base`` to those named ``digest`` (round ``round``
    is the round merged)."""

    round: int
    base: str
    digest: str
    payload: bytes


def quantized_step(codec: Codec, before: np.ndarray, merged: np.ndarray, seed: int,
                   feedback: ErrorFeedback) -> tuple[np.ndarray, bytes, float]:
    """(the weights the session moves to, the step's payload, the step's relative error): ``before`` plus exactly the
    decoded step from ``before`` to ``merged``. A codec that feeds its error back (topk) keeps what it dropped in
    ``feedback`` for the next step, and the error is measured against the step plus what it carried."""
    before = np.asarray(before, dtype=np.float32)
    step = (np.asarray(merged, dtype=np.float32) - before).astype(np.float32)
    corrected = feedback.corrected(codec, step)
    payload, decoded = feedback.encode(codec, step, seed)
    norm = float(np.linalg.norm(corrected.astype(np.float64)))
    error = float(np.linalg.norm((corrected - decoded).astype(np.float64))) / norm if norm > 0 else 0.0
    return (before + decoded).astype(np.float32), payload, error


class StepLog:
    """The recent steps, bounded: at most ``MAX_LINKS`` and at most ``budget`` payload bytes (a chain longer than
    one full weights message is never worth sending)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.steps: list[Step] = []

    def add(self, step: Step) -> None:
        self.steps.append(step)
        while self.steps and (len(self.steps) > MAX_LINKS or sum(len(s.payload) for s in self.steps) > self.budget):
            self.steps.pop(0)

    def clear(self) -> None:
        self.steps.clear()

    def chain(self, start: str, end: str) -> list[Step] | None:
        """The steps from the weights named ``start`` to those named ``end``, oldest first; None if the log has no
        such chain (walked back from ``end``, so a rollback to earlier weights still finds their step)."""
        by_digest = {step.digest: step for step in self.steps}  # (a later step to the same weights wins)
        links: list[Step] = []
        at = end
        while at != start:
            step = by_digest.get(at)
            if step is None or len(links) >= len(self.steps):
                return None
            links.append(step)
            at = step.base
        return links[::-1]


def encode_chain(links: Iterable[Step], *, spec: WeightSpec, fingerprint: str, codec: Codec, round_index: int) -> bytes:
    """A chain message of ``links`` (oldest first, each the next one's base), ending at round ``round_index``."""
    links = list(links)
    if not links:
        raise ValueError("a chain needs at least one step")
    header = {"spec": spec.to_json(), "fingerprint": fingerprint, "round": round_index, "codec": codec.to_json(),
              "from": links[0].base, "to": links[-1].digest,
              "links": [{"round": s.round, "base": s.base, "digest": s.digest, "bytes": len(s.payload)} for s in links]}
    return wire._frame(CHAIN_MAGIC, header, b"".join(s.payload for s in links))


def is_chain(data: bytes) -> bool:
    return bytes(memoryview(data)[:4]) == CHAIN_MAGIC


def apply_chain(data: bytes, held: np.ndarray | None, *, spec: WeightSpec,
                fingerprint: str) -> tuple[int, np.ndarray]:
    """(round, weights): the weights ``held`` moved along a chain message, each step checked against its name."""
    raw, payload = wire._unframe(data, CHAIN_MAGIC)
    if raw.get("fingerprint") != fingerprint:
        raise wire.FingerprintMismatch(f"chain is for task {raw.get('fingerprint')!r}, this peer runs {fingerprint!r}")
    spec_json = raw.get("spec")
    try:
        if not isinstance(spec_json, dict):
            raise ValueError("not an object")
        sent_spec = WeightSpec.from_json(spec_json)
    except Exception as error:  # (InvalidSpec, or not an object at all)
        raise wire.MalformedHeader(f"header field 'spec' is invalid: {error}") from error
    difference = spec.first_difference(sent_spec)
    if difference is not None:
        raise wire.ShapeMismatch(f"the chain's weights do not match the model's spec: {difference}")
    try:
        codec = codec_from_json(raw.get("codec"))
    except CodecError as error:
        raise wire.WrongCodec(f"the chain's codec: {error}") from error
    links = _links(raw.get("links"))
    round_index = raw.get("round")
    if isinstance(round_index, bool) or not isinstance(round_index, int) or round_index < 0:
        raise wire.MalformedHeader(f"header field 'round' must be a non-negative integer, got {round_index!r}")
    if sum(int(link["bytes"]) for link in links) != len(payload):
        raise wire.LengthMismatch(f"the links hold {sum(int(link['bytes']) for link in links)} bytes, the payload "
                                  f"{len(payload)}")
    if held is None:
        raise wire.WrongBase("a chain of steps needs the weights it starts from, and this peer holds none")
    weights = np.asarray(held, dtype=np.float32)
    digest, offset = weights_sha256(weights), 0
    for link in links:
        if link["base"] != digest:
            raise wire.WrongBase(f"a step starts at weights {link['base'][:16]}, this peer holds {digest[:16]}")
        size = int(link["bytes"])
        try:
            step = codec.decode(payload[offset:offset + size], spec.size)
        except CodecError as error:
            raise wire.WrongCodec(f"a step of the chain does not decode: {error}") from error
        offset += size
        weights = (weights + step).astype(np.float32)
        digest = weights_sha256(weights)
        if digest != link["digest"]:
            raise ChainMismatch(f"round {link['round']}'s step gave weights {digest[:16]}, the chain names "
                                f"{str(link['digest'])[:16]}")
    return round_index, weights


def _links(value: Any) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not value:
        raise wire.MalformedHeader("header field 'links' must be a non-empty list")
    for link in value:
        if not (isinstance(link, dict) and isinstance(link.get("base"), str) and isinstance(link.get("digest"), str)
                and isinstance(link.get("bytes"), int) and not isinstance(link.get("bytes"), bool)
                and link["bytes"] >= 0 and isinstance(link.get("round"), int)):
            raise wire.MalformedHeader(f"a link is {{round, base, digest, bytes}}, got {link!r}")
    return value
