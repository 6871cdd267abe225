"""Volunteers who last and credit for verified work, through the relay's HTTP API with native peers.

A volunteer is a key its page proves at each join (``server.relay.volunteers``); credit is the relay's count of
training FLOPs of each settled unit (``server.relay.credit``). The oracle of every figure here is the documented rule
computed by hand: 6 FLOPs per weight per example per local epoch of the majority example's MLP.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import dataclasses
import io
from pathlib import Path
from typing import Any

import httpx
import pytest
from relay_fixtures import (
    ADMIN_TOKEN,
    SMALL_SETTINGS,
    HttpPeer,
    flipped,
    make_relay,
    serving,
    session_status,
    wait_until,
    work_until_done,
)

from runtime.tasks import WorkUnit, load_task
from runtime.tasks.lm_task import LMTask
from server import cli
from server.relay.options import RelayOptions
from server.relay.volunteer_key import VolunteerKey
from server.session.package import Package

# The majority example's MLP (8 bits, 32 hidden, 2 classes) and a unit of SMALL_SETTINGS: 1024 rows in 4 chunks,
# 2 local epochs. Credit per unit, in GFLOP, by the rule the docs give: 6 x weights x examples x epochs / 1e9.
WEIGHTS = 8 * 32 + 32 + 32 * 2 + 2
UNIT_CREDIT = 6 * WEIGHTS * (SMALL_SETTINGS["examples"] // SMALL_SETTINGS["chunks"]) * SMALL_SETTINGS["epochs"] / 1e9
SCRIPTED = {name: value for name, value in {"verify_every": 0, "verify_direction": None}.items()
            if name in {f.name for f in dataclasses.fields(RelayOptions)}}


def credit(client: httpx.Client, volunteer: str | None = None) -> dict[str, Any]:
    answer = client.get("/api/credit", params={"volunteer": volunteer} if volunteer else {})
    assert answer.status_code == 200, answer.text
    return answer.json()


def units_by(client: httpx.Client) -> dict[str, int]:
    """Each peer's results the relay keeps (the audit export), undone ones left out."""
    rows = client.get("/api/admin/export/results", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).text
    import json

    counted: dict[str, int] = {}
    for line in rows.splitlines():
        row = json.loads(line)
        if not row["verification"].startswith("undone"):
            counted[row["peer_id"]] = counted.get(row["peer_id"], 0) + 1
    return counted


def join(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return client.post("/api/join", json=body)


def test_a_key_proven_at_each_join_is_one_volunteer_and_forgeries_are_refused(package: Package,
                                                                               tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s")
    alice, mallory = VolunteerKey(name="Alice", team="Lab"), VolunteerKey()
    with serving(relay) as client:
        first, second = HttpPeer(client, volunteer=alice), HttpPeer(client, volunteer=alice)  # two tabs, one key
        other = HttpPeer(client, volunteer=VolunteerKey())  # another browser profile
        assert relay.store.volunteer_of(first.peer_id) == relay.store.volunteer_of(second.peer_id) == alice.volunteer
        assert relay.store.volunteer_of(other.peer_id) not in ("", alice.volunteer)
        joined = session_status(client)["peers"]["joined"]

        def challenge() -> str:
            return str(client.post("/api/challenge").json()["challenge"])

        forged = alice.proof(challenge()) | {"signature": mallory.sign(challenge())}  # Mallory signs, Alice's key
        refusals = [
            (join(client, {"volunteer": forged}), 403, "volunteer_proof"),
            (join(client, {"volunteer": alice.proof("a-challenge-the-relay-never-gave")}), 403, "volunteer_proof"),
            (join(client, {"volunteer": alice.proof(challenge()) | {"public_key": base64.b64encode(b"junk").decode()}}),
             400, "bad_volunteer"),
            (join(client, {"volunteer": alice.proof(challenge()) | {"name": "x" * 41}}), 400, "bad_volunteer"),
            (join(client, {"volunteer": "Alice"}), 400, "bad_volunteer"),
        ]
        used = challenge()
        assert join(client, {"volunteer": alice.proof(used)}).status_code == 200
        refusals.append((join(client, {"volunteer": alice.proof(used)}), 403, "volunteer_proof"))  # used up
        for answer, status, code in refusals:
            assert (answer.status_code, answer.json()["error"]) == (status, code), answer.text
        assert session_status(client)["peers"]["joined"] == joined + 1  # no refused join made a peer
        assert relay.store.volunteers()[alice.volunteer] | {"created": 0, "last_joined": 0} == {
            "name": "Alice", "team": "Lab", "created": 0, "last_joined": 0}
        renamed = client.post("/api/volunteer", json={"name": "Alice B."}, headers=second.headers)
        assert renamed.json() == {"volunteer": alice.volunteer, "name": "Alice B.", "team": "Lab"}
        keyless = HttpPeer(client)
        assert client.post("/api/volunteer", json={"name": "x"}, headers=keyless.headers).json()["error"] == \
            "no_volunteer"
        status = session_status(client)
        mine = [v for v in status["volunteers"] if v["volunteer"] == alice.volunteer]
        assert len(mine) == 1 and mine[0]["name"] == "Alice B." and sorted(mine[0]["peers"]) == sorted(
            p[:8] for p in (first.peer_id, second.peer_id, next(
                p for p in relay.store.volunteer_peers(alice.volunteer) if p not in (first.peer_id, second.peer_id))))


def test_credit_is_the_hand_counted_flops_of_settled_units(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=2, passes=2)
    alice = VolunteerKey(team="Lab")
    with serving(relay) as client:
        peers = [HttpPeer(client, volunteer=alice), HttpPeer(client, volunteer=alice), HttpPeer(client)]
        work_until_done(client, peers)
        done = units_by(client)
        board = credit(client, alice.volunteer)
    assert sum(done.values()) == 8  # 4 rounds of 2 units
    by_alice = done.get(peers[0].peer_id, 0) + done.get(peers[1].peer_id, 0)
    assert board["you"]["total"] == pytest.approx(by_alice * UNIT_CREDIT, rel=1e-12)
    assert board["you"]["units"] == by_alice and board["you"]["team"] == "Lab"
    anonymous = next(v for v in board["volunteers"] if v["volunteer"] == peers[2].peer_id)
    assert anonymous["total"] == pytest.approx(done.get(peers[2].peer_id, 0) * UNIT_CREDIT, rel=1e-12)
    assert board["total"] == pytest.approx(8 * UNIT_CREDIT, rel=1e-12)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["credit", str(tmp_path / "s"), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert {row["volunteer"]: float(row["total"]) for row in rows} == pytest.approx(
        {v["volunteer"]: v["total"] for v in board["volunteers"]}, rel=1e-5)
    assert board["teams"] == [{"rank": 1, "team": "Lab", "total": board["you"]["total"],
                               "recent_average": board["you"]["recent_average"], "units": by_alice, "volunteers": 1}]
    # the recent average of credit given just now is its credit per day at a half-life of 7 days: total * ln 2 / 7
    assert board["you"]["recent_average"] == pytest.approx(board["you"]["total"] * 0.6931471805599453 / 7, rel=1e-3)


def test_a_ban_follows_the_key_and_takes_its_credit_back(package: Package, tmp_path: Path) -> None:
    """Every result replayed before its round merges: the liar's second result fails its replay, every peer of its
    key is banned, its credit goes; its key cannot join again; lifting the ban gives back what stayed merged."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, verify_fraction=1.0, replay_wait="all", **SCRIPTED)
    liar = VolunteerKey(name="Liar")
    with serving(relay) as client:
        cheat, tab, honest = HttpPeer(client, volunteer=liar), HttpPeer(client, volunteer=liar), HttpPeer(client)
        for peer in (cheat, honest):  # round 0: both honest
            assert peer.train_and_upload().status_code == 200
        wait_until(client, lambda s: s["round"] == 1 and not s["merging"])
        wait_until(client, lambda s: s["round"] == 2 or credit(client, liar.volunteer)["you"] is not None, timeout=60)
        job = cheat.assignment()
        assert cheat.upload(job["round"], job["slot"], flipped(cheat, job, relay)).status_code == 200
        wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 2)  # the cheat and its other tab
        assert {relay.store.ban_reason(p) is not None for p in (cheat.peer_id, tab.peer_id)} == {True}
        assert credit(client, liar.volunteer)["you"] is None  # banned: no credit, not on the board
        again = join(client, {"volunteer": liar.proof(client.post("/api/challenge").json()["challenge"])})
        assert (again.status_code, again.json()["error"]) == (403, "banned")
        work_until_done(client, [honest])
        lifted = client.post("/api/admin/unban", json={"peer_id": tab.peer_id},
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert lifted.status_code == 200 and relay.store.ban_reason(cheat.peer_id) is None  # the key's ban, lifted
        kept = units_by(client).get(cheat.peer_id, 0)
        assert kept == 1  # its honest round-0 result stayed merged (it passed its replay); the lie never merged
        assert credit(client, liar.volunteer)["you"]["total"] == pytest.approx(kept * UNIT_CREDIT, rel=1e-12)


def test_a_volunteers_record_follows_its_key(package: Package, tmp_path: Path) -> None:
    """Only first results are replayed here: a second tab of a volunteer already checked is no newcomer, while a
    new key is (what a new key costs: its first result replayed, as any new peer's)."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=2, verify_fraction=0.0, replay_wait="all", **SCRIPTED)
    alice = VolunteerKey()
    with serving(relay) as client:
        first, stranger = HttpPeer(client, volunteer=alice), HttpPeer(client, volunteer=VolunteerKey())
        for peer in (first, stranger):
            assert peer.train_and_upload().status_code == 200
        wait_until(client, lambda s: s["round"] == 1 and not s["merging"])
        reload, newcomer = HttpPeer(client, volunteer=alice), HttpPeer(client, volunteer=VolunteerKey())
        for peer in (reload, newcomer):
            assert peer.train_and_upload().status_code == 200
        wait_until(client, lambda s: s["round"] == 2 and not s["merging"])
    relay.store.open()
    checked = {row["peer_id"]: row["verification"] for row in relay.store.audit()}
    assert "replay passed" in checked[first.peer_id] and "replay passed" in checked[stranger.peer_id]
    assert "replay passed" in checked[newcomer.peer_id]  # a new key: replayed
    assert checked[reload.peer_id] == "not checked"  # the same key in a new tab: its record holds


def test_a_local_units_credit_needs_none_of_its_peers_bytes() -> None:
    """A local unit's data stays in its peer's browser: the relay counts it from the recipe (steps x batch x context
    tokens), as a host-cut bytetext unit of the same recipe (a count that needed the bytes broke the status)."""
    local, hosted = load_task("bytetext-local"), load_task("bytetext")
    s = local.settings
    tokens = s.steps * s.batch_size * local.config().context
    assert local.unit_flops(WorkUnit(index=3, seed=1), 100) == 6.0 * local.spec().size * tokens
    unit = hosted.work_unit(hosted.prepare(), 0, seed=0)
    assert hosted.unit_flops(unit, 1) == LMTask.unit_flops(hosted, unit, 1)  # (the count from the tokens themselves)
