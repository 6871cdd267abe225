"""The peer protocol's messages, typed once: what the relay answers a peer and what a peer does after a refusal.

The relay builds these objects (``server.relay.jobs``, the round modes) and sends ``to_json()``; every Python peer
reads them with ``from_json`` (``server.harness.native_peer``, ``runtime.peer.Peer.train``); the page's worker
(``web/src/worker.js``) declares the same fields in a JSDoc typedef, which ``tests/runtime/test_protocol.py``
holds to ``json_schema()``. A message that does not parse raises ``ProtocolError`` naming the field, so a peer
meets a relay it does not understand with a clear error, not a ``KeyError`` three calls later.

    POST /api/join          -> Joined
    POST /api/work[?hold=S] -> Job | Wait | Done          (``work_answer_from_json``)
    POST /api/result        -> Receipt
    any request             -> a refusal: 4xx/5xx {"error": RefusalCode, "message"}; ``action_after`` says what a
                               peer does next (``PeerAction``)

Optional fields are left out of the JSON when they are None, as the relay always has: a job of a session without
a compressing codec carries no ``codec``, one that is not a copy no ``copy``.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, fields
from enum import StrEnum
from typing import Any, Literal, TypeVar

from runtime.planner import Assignment

Message = TypeVar("Message", bound="_Message")
JobKind = Literal["data", "experience", "local"]
CopyKind = Literal["backup"]  # (a redundancy check's job says nothing: its peer must not know its result is compared)


class ProtocolError(ValueError):
    """A message that is not what the protocol says (a missing field, a wrong type, an unknown answer)."""


class _Message:
    """JSON round trip for the frozen dataclasses below, checked field by field against their annotations."""

    def to_json(self) -> dict[str, Any]:
        return {name: value for name, value in asdict(self).items()  # type: ignore[call-overload]
                if value is not None}

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls: type[Message], data: object) -> Message:
        if isinstance(data, str | bytes):
            data = json.loads(data)
        if not isinstance(data, dict):
            raise ProtocolError(f"a {cls.__name__} is a JSON object, got {type(data).__name__}")
        hints = _hints(cls)
        values: dict[str, Any] = {}
        for spec in fields(cls):  # type: ignore[arg-type]
            if spec.name not in data or data[spec.name] is None:
                if spec.default is MISSING:
                    raise ProtocolError(f"a {cls.__name__} needs {spec.name!r}; got the fields {sorted(data)}")
                continue
            values[spec.name] = _checked(cls.__name__, spec.name, data[spec.name], hints[spec.name])
        return cls(**values)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """A message class's field types, resolved once (``typing.get_type_hints`` evaluates every annotation anew: 50 us
    a message, paid by a peer on every answer it reads)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _checked(message: str, name: str, value: object, hint: Any) -> Any:
    """``value`` if it has the annotated type (ints are floats too; bools are not numbers), else ProtocolError."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for option in options:
        if option is type(None):
            continue
        origin = typing.get_origin(option)
        if origin is Literal:
            if value in typing.get_args(option):
                return value
        elif option is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
        elif option is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif option is bool:
            if isinstance(value, bool):
                return value
        elif option is str:
            if isinstance(value, str):
                return value
        elif origin is dict:
            if isinstance(value, dict):
                return value
    raise ProtocolError(f"{message}.{name} must be {_type_name(hint)}, got {value!r}")


def _type_name(hint: Any) -> str:
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    names = []
    for option in options:
        if option is type(None):
            continue
        if typing.get_origin(option) is Literal:
            names.append(" or ".join(repr(v) for v in typing.get_args(option)))
        else:
            names.append(getattr(option, "__name__", str(option)))
    return " or ".join(names)


# -- what POST /api/work answers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job(_Message):
    """A unit to train, leased to the peer until ``lease_deadline`` (the relay's clock; ``lease_seconds`` from
    now). The peer trains from the weights ``weights_digest`` names (``GET weights_url``, or the chain of steps
    from the weights it holds), on unit ``unit_index`` (``GET /api/unit/{unit_index}`` for a data task) with
    ``unit_seed``, and uploads to ``POST /api/result?round=&slot=``."""

    round: int
    slot: int
    pass_index: int
    unit_index: int
    unit_seed: int
    kind: JobKind  # the task's kind: "data" units are chunks the host cut; "experience" episodes; "local" files
    episodes: int  # episodes to play (experience tasks), else 0
    progress: float  # how far into the session this round is, in [0, 1] (a task may schedule its lr by it)
    lease_deadline: float
    lease_seconds: float
    weights_round: int
    num_rounds: int
    fingerprint: str  # the task package's fingerprint; results name it
    weights_digest: str | None = None  # sha256 of the weights to train from (a relay before these names none)
    weights_url: str | None = None
    carried_from: int | None = None  # the round this unit was first planned in (a deadline carried it)
    codec: dict[str, Any] | None = None  # the result codec's JSON (``runtime.codec``); absent: float32 weights
    copy: CopyKind | None = None  # a backup: a second copy of a unit a slow peer trains

    @property
    def assignment(self) -> Assignment:
        return Assignment(self.round, self.slot, self.pass_index, self.unit_index, self.unit_seed)


@dataclass(frozen=True)
class Wait(_Message):
    """No unit for this peer now: ask again after ``wait`` seconds (0: at once; a held ask ended)."""

    wait: float
    reason: str


@dataclass(frozen=True)
class Done(_Message):
    """The session is over: stop asking."""

    reason: str
    done: bool = True


WorkAnswer = Job | Wait | Done


def work_answer_from_json(data: object) -> WorkAnswer:
    """The answer of ``POST /api/work`` as its message: ``Done`` if it says done, ``Wait`` if it says wait, else a
    ``Job``."""
    if isinstance(data, str | bytes):
        data = json.loads(data)
    if isinstance(data, dict) and data.get("done"):
        return Done.from_json(data)
    if isinstance(data, dict) and "wait" in data:
        return Wait.from_json(data)
    return Job.from_json(data)


# -- other answers ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Joined(_Message):
    """``POST /api/join``: the peer's id and the token it proves itself with (``Authorization: Bearer id:token``)."""

    peer_id: str
    token: str


@dataclass(frozen=True)
class Receipt(_Message):
    """``POST /api/result``: the result of (``round``, ``slot``) is stored (checks that run later may still ban)."""

    accepted: bool
    round: int
    slot: int


MESSAGES: tuple[type[_Message], ...] = (Job, Wait, Done, Joined, Receipt)


# -- refusals --------------------------------------------------------------------------------------------------
class RefusalCode(StrEnum):
    """Every ``error`` code a relay's refusal may carry (``{"error": code, "message"}``), by HTTP status."""

    # 400: the request or the wire message cannot be read
    BAD_JSON = "bad_json"
    BAD_QUERY = "bad_query"
    WIRE_ERROR = "wire_error"
    TRUNCATED = "truncated"
    BAD_MAGIC = "bad_magic"
    OUTDATED_FORMAT = "outdated_format"
    CHECKSUM = "checksum"
    HEADER_LENGTH = "header_length"
    MALFORMED_HEADER = "malformed_header"
    DTYPE_MISMATCH = "dtype_mismatch"
    LENGTH_MISMATCH = "length_mismatch"
    BAD_UPDATE = "bad_update"
    BAD_CODEC = "bad_codec"
    CHAIN_MISMATCH = "chain_mismatch"
    BAD_ENGINE_CLASS = "bad_engine_class"
    BAD_VOLUNTEER = "bad_volunteer"
    # 401
    UNAUTHORIZED = "unauthorized"
    # 403
    JOIN_CODE = "join_code"
    NOT_LEASED = "not_leased"
    BANNED = "banned"
    VOLUNTEER_PROOF = "volunteer_proof"
    # 404, 405
    UNKNOWN_SLOT = "unknown_slot"
    UNKNOWN_UNIT = "unknown_unit"
    UNKNOWN_WEIGHTS = "unknown_weights"
    UNKNOWN_ACTION = "unknown_action"
    UNKNOWN_EXPORT = "unknown_export"
    NOT_BANNED = "not_banned"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    # 408
    BODY_TIMEOUT = "body_timeout"
    HEADER_TIMEOUT = "header_timeout"
    # 409: the result belongs to another round, session or lease, or to other weights
    STALE_ROUND = "stale_round"
    DUPLICATE = "duplicate"
    LATE = "late"
    PAST_DEADLINE = "past_deadline"
    ROUND_REDONE = "round_redone"
    TOO_STALE = "too_stale"
    FINGERPRINT_MISMATCH = "fingerprint_mismatch"
    WRONG_BASE = "wrong_base"
    SESSION_RUNNING = "session_running"
    REPLICA = "replica"  # a host's change asked of a relay serving beside the one that holds the session
    NO_SESSION_FOLDER = "no_session_folder"
    NO_VOLUNTEER = "no_volunteer"
    # 413
    TOO_LARGE = "too_large"
    # 422: a result (or session request) whose content is refused
    NUM_EXAMPLES = "num_examples"
    NUM_EXAMPLES_CLAIM = "num_examples_claim"
    NON_FINITE = "non_finite"
    SHAPE_MISMATCH = "shape_mismatch"
    WRONG_CODEC = "wrong_codec"
    UPDATE_NORM = "update_norm"
    UPDATE_OUTLIER = "update_outlier"
    LOCAL_DP = "local_dp"
    ENGINE_NOT_REPLAYABLE = "engine_not_replayable"
    BAD_SESSION = "bad_session"
    # 429: admission limits per client address (Retry-After)
    JOIN_RATE = "join_rate"
    TOO_MANY_PEERS = "too_many_peers"
    # 503: the relay cannot serve now (Retry-After)
    DISK_FULL = "disk_full"
    REPLACING = "replacing"
    HOLDER_UNAVAILABLE = "holder_unavailable"  # a replica whose holder judged no result handed over (send it again)
    HTTP_ERROR = "http_error"


class PeerAction(StrEnum):
    """What a peer does after a refusal."""

    CONTINUE = "continue"  # drop the unit in hand (if any) and ask for work again
    REFETCH_WEIGHTS = "refetch_weights"  # the weights held or named are not the relay's: fetch them again, go on
    RETRY = "retry"  # the relay is busy or limits this address: the same request again after Retry-After
    REJOIN = "rejoin"  # the token is unknown (a new session, a restarted relay's new store): join again
    STOP = "stop"  # banned, or this peer's runtime sends what the relay no longer takes: stop for good


# Codes whose action is not their status's default (``action_after``).
ACTIONS: dict[RefusalCode, PeerAction] = {
    RefusalCode.BANNED: PeerAction.STOP,
    RefusalCode.OUTDATED_FORMAT: PeerAction.STOP,  # the page's wire format is older than the relay's
    RefusalCode.WRONG_CODEC: PeerAction.STOP,  # the page's runtime does not send the session's codec
    RefusalCode.ENGINE_NOT_REPLAYABLE: PeerAction.STOP,  # its engine's results cannot be checked in this session
    RefusalCode.BAD_ENGINE_CLASS: PeerAction.STOP,  # the peer's runtime names its engine in a way the relay refuses
    RefusalCode.UNKNOWN_WEIGHTS: PeerAction.REFETCH_WEIGHTS,
    RefusalCode.WRONG_BASE: PeerAction.REFETCH_WEIGHTS,
    RefusalCode.CHAIN_MISMATCH: PeerAction.REFETCH_WEIGHTS,
    RefusalCode.VOLUNTEER_PROOF: PeerAction.REJOIN,  # the challenge ran out (a restarted relay): sign a new one
}
_BY_STATUS: tuple[tuple[range, PeerAction], ...] = (
    (range(401, 402), PeerAction.REJOIN),
    (range(429, 430), PeerAction.RETRY),
    (range(400, 500), PeerAction.CONTINUE),
    (range(500, 600), PeerAction.RETRY),
)


def action_after(status: int, code: str | None) -> PeerAction:
    """What a peer does after a refusal of ``status`` with ``code`` (an unknown code: its status's default)."""
    try:
        known = RefusalCode(code) if code is not None else None
    except ValueError:
        known = None
    if known in ACTIONS:
        return ACTIONS[known]  # type: ignore[index]
    for statuses, action in _BY_STATUS:
        if status in statuses:
            return action
    raise ProtocolError(f"HTTP {status} is not a refusal")


# -- the schema the page's worker is checked against --------------------------------------------------------------
_JSON_TYPES: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _schema_of(hint: Any) -> dict[str, Any]:
    options = [o for o in (typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType)
                           else (hint,)) if o is not type(None)]
    (option,) = options
    if typing.get_origin(option) is Literal:
        return {"enum": list(typing.get_args(option))}
    if typing.get_origin(option) is dict:
        return {"type": "object"}
    return {"type": _JSON_TYPES[option]}


def json_schema(message: type[_Message]) -> dict[str, Any]:
    """A JSON Schema (2020-12) of ``message``: its fields, their types, the required ones."""
    hints = typing.get_type_hints(message)
    specs = fields(message)  # type: ignore[arg-type]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": message.__name__,
            "type": "object", "properties": {s.name: _schema_of(hints[s.name]) for s in specs},
            "required": [s.name for s in specs if s.default is MISSING]}

