"""What a store hands back, whichever store it is: a lease, a stored result, the rows of the asynchronous buffer,
a pending undo; and the two digests every store records the same way (a token's hash, a message's sha256)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any


def hash_token(token: str) -> str:
    """What a store keeps of a peer's token (never the token itself)."""
    return sha256_hex(token.encode())


def sha256_hex(data: bytes) -> str:
    """A message's digest as the audit records it."""
    return hashlib.sha256(data).hexdigest()


ASYNC_ROUND = -1  # the leases table's round for the asynchronous stream of units (the slot: the schedule entry)


class AlreadyArrived(Exception):
    """An entry of the asynchronous stream has its result already (another relay over the store took it)."""


@dataclass(frozen=True)
class Lease:
    round: int
    slot: int
    unit_index: int
    peer_id: str
    issued: float
    deadline: float
    copy: int = 0  # 0: the unit's own lease; 1: a second copy (redundancy, a backup)
    version: int = 0  # the weights version the unit was handed out with (async mode; 0 for a round's lease)


@dataclass(frozen=True)
class StoredResult:
    round: int
    slot: int
    unit_index: int
    peer_id: str
    num_examples: int
    metrics: dict[str, Any]
    message: bytes
    engine: str = ""  # what the result says it trained on (header meta; not stored apart from the message)
    engine_class: str = ""  # the engine and its numpy build (``runtime.peer.engine_class``; header meta, likewise)


@dataclass(frozen=True)
class ForwardedResult:
    """A result of a synchronous round that a replica took and handed, through the store, to the relay holding the
    session, which alone judges and keeps it (``server.relay.sharing``); ``id`` orders them as they came."""

    id: int
    round: int
    slot: int
    peer_id: str
    message: bytes


# Asynchronous mode: a result waiting in the buffer, (seq, entry, unit, version, examples, metrics, update vector,
# message); the update vector is empty where the message carries the update (``server.session.buffered``).
type BufferedArrival = tuple[int, int, int, int, int, dict[str, Any], bytes, bytes]
# A result merged in asynchronous mode, (seq, entry, unit, version, merge, examples, metrics, message).
type MergedArrival = tuple[int, int, int, int, int, int, dict[str, Any], bytes]
# A ban's undo not finished yet, (peer, state, plan): ``server.relay.undo`` writes the state and plan.
type PendingUndo = tuple[str, str, dict[str, Any]]


@dataclass(frozen=True)
class ReplayJob:
    """A replay waiting in the store for a verification worker (``peertrain verify-worker``): the job (its JSON),
    the digests of the task's description and of the global weights (``Store.blob``), the unit's data (empty for an
    experience unit) and the engine to replay on."""

    id: int
    job: str
    task: str
    weights: str
    unit: bytes
    engine: str
    attempts: int  # claims so far, this one included (a worker that died leaves its claim to expire)


@dataclass(frozen=True)
class FinishedReplay:
    """What a worker sent back: the replay's result message (empty when it failed), why it failed (its engine's
    error, "" when it did not), the seconds it took and the engine that ran it."""

    message: bytes
    error: str
    seconds: float
    engine: str
