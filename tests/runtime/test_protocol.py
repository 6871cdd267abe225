"""``runtime.protocol``: the peer protocol's messages round-trip, refuse what they do not declare, and the page's
worker (``web/src/worker.js``) declares and reads exactly the same fields."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from runtime import protocol
from runtime.planner import Assignment
from runtime.protocol import (
    Done,
    Job,
    Joined,
    PeerAction,
    ProtocolError,
    Receipt,
    RefusalCode,
    Wait,
    action_after,
    json_schema,
    work_answer_from_json,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = REPO_ROOT / "web" / "src" / "worker.js"
JOB: dict[str, Any] = {"round": 2, "slot": 1, "pass_index": 0, "unit_index": 7, "unit_seed": 123456,
                       "kind": "data", "episodes": 0, "progress": 0.25, "lease_deadline": 1700000000.5,
                       "lease_seconds": 30.0, "weights_round": 2, "num_rounds": 8, "fingerprint": "f" * 16,
                       "weights_digest": "d" * 64, "weights_url": "/api/weights/" + "d" * 64}


def test_a_job_round_trips_and_leaves_out_what_it_does_not_carry() -> None:
    job = Job.from_json(JOB)
    assert job.to_json() == JOB  # (no codec, no copy, no carried_from: absent, as the relay always sent them)
    assert Job.from_json(job.dumps()) == job
    assert job.assignment == Assignment(2, 1, 0, 7, 123456)
    copy = Job.from_json({**JOB, "copy": "backup", "codec": {"name": "int8", "block": 256}, "carried_from": 1})
    assert copy.to_json()["copy"] == "backup" and copy.codec == {"name": "int8", "block": 256}


def test_whole_numbers_are_numbers_but_booleans_are_not() -> None:
    assert Job.from_json({**JOB, "progress": 1, "lease_seconds": 5}).progress == 1.0
    with pytest.raises(ProtocolError, match=r"Job.round must be int, got True"):
        Job.from_json({**JOB, "round": True})
    with pytest.raises(ProtocolError, match=r"Job.progress must be float"):
        Job.from_json({**JOB, "progress": "half"})


@pytest.mark.parametrize(("change", "message"), [
    ({"slot": None}, r"a Job needs 'slot'"),
    ({"kind": "video"}, r"Job.kind must be 'data' or 'experience' or 'local', got 'video'"),
    ({"copy": "redundancy"}, r"Job.copy must be 'backup'"),
    ({"codec": "int8"}, r"Job.codec must be dict"),
    ({"unit_seed": 1.5}, r"Job.unit_seed must be int"),
])
def test_a_job_that_is_not_one_names_its_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        Job.from_json({**JOB, **change})


def test_unknown_fields_are_ignored_so_a_newer_relay_can_add_some() -> None:
    assert Job.from_json({**JOB, "something_new": [1, 2]}) == Job.from_json(JOB)


def test_the_work_answer_is_a_job_a_wait_or_the_end() -> None:
    assert work_answer_from_json({"wait": 0, "reason": "paused"}) == Wait(0.0, "paused")
    assert work_answer_from_json('{"done": true, "reason": "the session is complete"}') == \
        Done("the session is complete")
    assert Done("x").to_json() == {"reason": "x", "done": True}
    assert isinstance(work_answer_from_json(JOB), Job)
    with pytest.raises(ProtocolError, match="a Job is a JSON object, got list"):
        work_answer_from_json([1])
    assert Joined.from_json({"peer_id": "p", "token": "t"}) == Joined("p", "t")
    assert Receipt.from_json({"accepted": True, "round": 0, "slot": 2}).slot == 2


def test_what_a_peer_does_after_each_refusal() -> None:
    assert action_after(403, "banned") is PeerAction.STOP
    assert action_after(401, "unauthorized") is PeerAction.REJOIN
    assert action_after(429, "join_rate") is action_after(503, "disk_full") is PeerAction.RETRY
    assert action_after(404, "unknown_weights") is PeerAction.REFETCH_WEIGHTS
    assert action_after(409, "wrong_base") is PeerAction.REFETCH_WEIGHTS
    assert action_after(403, "not_leased") is action_after(409, "past_deadline") is PeerAction.CONTINUE
    assert action_after(409, "a_code_from_a_newer_relay") is PeerAction.CONTINUE
    assert action_after(502, None) is PeerAction.RETRY
    with pytest.raises(ProtocolError):
        action_after(200, None)


def test_every_refusal_code_the_relay_documents_is_in_the_enum() -> None:
    from server.relay import endpoints, openapi

    document = openapi.document(endpoints.API)
    documented = {code for by_status in openapi.documented_codes(document).values()
                  for codes in by_status.values() for code in codes}
    assert documented, "the document lists no refusal codes"
    assert documented - {c.value for c in RefusalCode} == set()


# -- the page's worker -------------------------------------------------------------------------------------------
TYPEDEF = re.compile(r"@typedef \{Object\} (\w+)(.*?)\*/", re.S)
PROPERTY = re.compile(r"@property \{([^}]+)\} (\[?)(\w+)\]?")
JS_TYPES = {"integer": "number", "number": "number", "string": "string", "boolean": "boolean", "object": "Object"}


def worker_typedefs() -> dict[str, dict[str, tuple[str, bool]]]:
    """typedef name -> property -> (JSDoc type, required)."""
    found = {}
    for name, body in TYPEDEF.findall(WORKER.read_text()):
        found[name] = {prop: (kind, not optional) for kind, optional, prop in PROPERTY.findall(body)}
    return found


def jsdoc_type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(f'"{v}"' for v in schema["enum"])
    return JS_TYPES[schema["type"]]


@pytest.mark.parametrize("message", [Job, Wait, Done], ids=lambda m: m.__name__)
def test_the_workers_typedef_declares_the_protocols_fields(message: type[Job]) -> None:
    typedefs = worker_typedefs()
    assert message.__name__ in typedefs, f"web/src/worker.js has no @typedef {{Object}} {message.__name__}"
    schema = json_schema(message)
    expected = {name: (jsdoc_type(field), name in schema["required"]) for name, field in schema["properties"].items()}
    assert typedefs[message.__name__] == expected


def test_the_worker_reads_only_declared_job_fields() -> None:
    used = set(re.findall(r"\bjob\.(\w+)", WORKER.read_text()))
    declared = {f.name for m in (Job, Wait, Done) for f in fields(m)}
    assert used, "the pattern found no job.<field> in worker.js"
    assert used - declared == set()
    assert {"round", "slot", "weights_digest", "wait", "done"} <= used


def test_the_worker_stops_after_exactly_the_codes_the_protocol_says_stop() -> None:
    """worker.js stops for ``banned`` and for its OUT_OF_DATE and CANNOT_BE_CHECKED codes; the protocol's STOP codes
    are the same set."""
    source = WORKER.read_text()
    sets = {name: set(re.findall(r'"(\w+)"', re.search(rf"const {name} = new Set\(\[(.*?)\]\)", source)[1]))
            for name in ("OUT_OF_DATE", "CANNOT_BE_CHECKED")}
    assert 'error.code === "banned"' in source
    stops = {code.value for code, action in protocol.ACTIONS.items() if action is PeerAction.STOP}
    assert stops == sets["OUT_OF_DATE"] | sets["CANNOT_BE_CHECKED"] | {"banned"}
