"""A ban undoes what the banned peer moved (``server.relay.undo``): a patient attacker uploads one honest result, then
poisoned ones (``global - 0.5 x update``) until a sampled replay bans it; the rounds since its verified result are
merged again without it, and the session ends on the weights of a fresh session fed the same honest results without
the attacker's, bit for bit. Also: an undo interrupted on disk and a relay restarted mid-way resume consistently;
an undo beyond its bound is partial and says so."""

from __future__ import annotations

import dataclasses
import errno
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import HttpPeer, make_relay, serving, session_status, wait_for_round, wait_until

from runtime import wire
from runtime.codec import Codec
from runtime.tasks import UnitResult
from server.bench.attack_peers import as_upload, result_weights
from server.relay.client import work_call
from server.relay.options import RelayOptions
from server.relay.state import Relay
from server.relay.store import open_store
from server.relay.undo import REBASED
from server.relay.verify import LocalReplays, sampled
from server.session.package import Package
from server.session.session import Session

PASSES = 5  # 4 units, 2 a round: 10 rounds, and the attacker's units carried into one more
# FedAvgM keeps momentum: a redo steps from the momentum checkpointed before its first round. (The majority task's
# loss falls to ~1e-4, where the divergence watch's "3 x best" is noise: not the point here.)
CONFIG = {"merge": "fedavgm", "force": True, "divergence_factor": 1e6}
Key = tuple[int, int]  # (round, slot)
# These tests script which results are replayed: every peer's first and a seeded share (``fraction_catching``). The
# coverage bound and the suspicion by direction (where this relay has them) would catch the attacker sooner: off.
SCRIPTED = {name: value for name, value in {"verify_every": 0, "verify_direction": None}.items()
            if name in {f.name for f in dataclasses.fields(RelayOptions)}}


def fraction_catching(ban_round: int, seed: int = 0, slot: int = 0) -> float:
    """A replay share whose seeded draw spares slot ``slot`` in rounds 1 to ``ban_round - 1`` and checks it in
    ``ban_round`` (the attacker's first result, in round 0, is replayed as every peer's first is)."""
    for step in range(10, 990):
        fraction = step / 1000
        if sampled(seed, ban_round, slot, fraction) and not any(sampled(seed, r, slot, fraction)
                                                                for r in range(1, ban_round)):
            return fraction
    raise AssertionError(f"no replay share catches round {ban_round} first")


def upload(peer: HttpPeer, job: dict[str, Any], trained_from: dict[Key, np.ndarray], *, poison: bool = False) -> None:
    """Train ``job``, note the weights it was trained from, upload it honest or as ``global - 0.5 x update``."""
    body = peer.train(job)
    assert peer.peer.weights is not None
    base = peer.peer.weights.copy()
    trained_from[(job["round"], job["slot"])] = base
    if poison:
        codec = Codec.from_json(job["codec"]) if job.get("codec") else None
        header, trained = result_weights(body, base, codec)
        body = as_upload((base - 0.5 * (trained - base)).astype(np.float32), header, base, codec, job["unit_seed"])
    response = peer.upload(job["round"], job["slot"], body)
    assert response.status_code == 200, response.text


def attack(client: Any, attacker: HttpPeer, honest: HttpPeer, ban_round: int,
           trained_from: dict[Key, np.ndarray]) -> None:
    """Rounds 0 to ``ban_round``: the attacker takes slot 0 (honest in round 0, poisoned after), the honest peer
    slot 1 and uploads first; in ``ban_round`` the attacker's result is replayed and it is banned."""
    for round_index in range(ban_round + 1):
        jobs = attacker.assignment(), honest.assignment()
        assert [job["slot"] for job in jobs] == [0, 1] and jobs[0]["round"] == round_index
        upload(honest, jobs[1], trained_from)
        upload(attacker, jobs[0], trained_from, poison=round_index > 0)
        if round_index < ban_round:
            wait_for_round(client, round_index + 1)


def finish(client: Any, honest: HttpPeer, trained_from: dict[Key, np.ndarray], *, rounds: int | None = None) -> None:
    """The honest peer alone trains every unit until the session is done (or ``rounds`` more rounds merged)."""
    stop = None if rounds is None else session_status(client)["round"] + rounds
    for _ in range(200):
        status = session_status(client)
        if status["done"] or (stop is not None and status["round"] >= stop and not status["merging"]):
            return
        job = honest.work(hold=5)  # (held while a merge or an undo runs: 200 asks answered "wait" at once ran out
        # under a loaded suite while the relay still merged)
        if "slot" in job:
            upload(honest, job, trained_from)
    raise AssertionError(f"the session did not finish: {session_status(client)}")


def undo_events(session: Session) -> list[dict[str, Any]]:
    return [event for entry in session.history for event in entry["events"] if event["type"] == "undo"]


def oracle(package: Package, relay: Relay, trained_from: dict[Key, np.ndarray]) -> Session:
    """A fresh session fed the relay's stored results as the undo means them: the undone ones left out (their units
    carried after the last redone round), every other one as it is, as its update onto the weights of its round."""
    relay.store.open()  # (closed when its app stopped)
    undone = {(row["round"], row["slot"]) for row in relay.store.audit() if row["verification"].startswith("undone")}
    redone = next(iter(undo_events(relay.session)), {"rounds": []})["rounds"]  # (none: the ban came before a merge)
    session = Session.create(package, relay.session.config)
    codec = session.config.result_codec
    by_round: dict[int, list[Any]] = {}
    for stored in relay.store.all_results():
        by_round.setdefault(stored.round, []).append(stored)
    withheld: list[tuple[int, int, int]] = []
    for round_index in sorted(by_round):
        assert round_index == session.round
        by_slot = {a.slot: a for a in session.assignments()}
        pairs = []
        for stored in by_round[round_index]:
            assignment = by_slot[stored.slot]
            assert assignment.unit_index == stored.unit_index
            if (round_index, stored.slot) in undone:
                withheld.append((assignment.pass_index, assignment.unit_index, assignment.round))
                continue
            base = trained_from[(round_index, stored.slot)]
            if not wire.is_update(stored.message) and REBASED in wire.decode(stored.message)[0].meta:
                vector = wire.decode(stored.message)[1]  # (an undo stored it as it stands on the redone round)
            else:
                _, vector = wire.result_weights(stored.message, base, codec=codec)
                if not np.array_equal(base, session.weights):
                    vector = (session.weights + (vector - base)).astype(np.float32)
            pairs.append((assignment, UnitResult(vector, stored.num_examples, stored.metrics)))
        carry = (withheld if round_index == redone[-1] else []) if round_index in redone else None
        session.complete_round(pairs, carry_missing=True, carry=carry)
    assert session.done
    return session


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_a_ban_undoes_the_attackers_rounds_and_ends_on_the_honest_oracle(package: Package, tmp_path: Path,
                                                                         codec: str) -> None:
    ban_round = 3
    relay = make_relay(package, tmp_path / "s", k=2, passes=PASSES, config=CONFIG | {"codec": codec},
                       verify_fraction=fraction_catching(ban_round), **SCRIPTED)
    trained_from: dict[Key, np.ndarray] = {}
    with serving(relay) as client:
        attacker, honest = HttpPeer(client), HttpPeer(client)
        attack(client, attacker, honest, ban_round, trained_from)
        poisoned_digest = honest.peer.weights_sha  # (the weights of round 3 before the undo)
        status = wait_until(client, lambda s: s["counters"].get("undos", 0) == 1 and not s["merging"])
        assert status["counters"]["peers_banned"] == 1 and status["counters"]["rounds_redone"] == ban_round - 1
        assert status["counters"]["results_undone"] == ban_round - 1
        assert attacker.send(work_call()).status_code == 403  # banned
        job = honest.work()
        assert job["round"] == ban_round and job["weights_digest"] != poisoned_digest  # the corrected weights
        assert client.get(f"/api/weights/{poisoned_digest}").status_code == 404  # no longer served
        chain = client.get(f"/api/weights/{job['weights_digest']}/from/{poisoned_digest}", follow_redirects=False)
        assert chain.status_code == 307  # no chain from the poisoned weights: the full weights
        upload(honest, job, trained_from)
        finish(client, honest, trained_from)
        assert relay.session.done and relay.session.stopped is None
    (event,) = undo_events(relay.session)
    assert event["peer"] == attacker.peer_id and event["rounds"] == [1, 2] and event["verified_through"] == 0
    assert event["not_redone"] == [] and len(event["carried"]) == 2 and event["results"] == 2
    expected = oracle(package, relay, trained_from)
    np.testing.assert_array_equal(relay.session.weights, expected.weights)
    assert [e["units"] for e in relay.session.history] == [e["units"] for e in expected.history]
    on_disk = Session.restore(tmp_path / "s", package)  # the checkpoints rolled forward from the corrected round
    np.testing.assert_array_equal(on_disk.weights, expected.weights)
    assert undo_events(on_disk) == [event] and not (tmp_path / "s" / "undone").exists()
    assert all(e["metrics"] == o["metrics"] for e, o in zip(relay.session.history, expected.history, strict=True))


def restarted(relay: Relay, package: Package, directory: Path) -> Relay:
    return Relay(session=Session.restore(directory, package), package=package,
                 store=open_store(directory / "relay.sqlite3"), options=relay.options)


def test_an_undo_stopped_midway_and_a_restart_after_it_resume_consistently(package: Package, tmp_path: Path) -> None:
    """The disk fills while the second redone round merges: the relay goes back to the checkpoint of the first redone
    round and stops; a new relay on the same files finishes the undo before it hands anything out. A second restart
    a round later changes nothing either: the session ends on the oracle's weights."""
    ban_round, directory = 3, tmp_path / "s"
    relay = make_relay(package, directory, k=2, passes=PASSES, config=CONFIG,
                       verify_fraction=fraction_catching(ban_round), **SCRIPTED)
    trained_from: dict[Key, np.ndarray] = {}
    with serving(relay) as client:
        attacker, honest = HttpPeer(client), HttpPeer(client)
        attack(client, attacker, honest, ban_round - 1, trained_from)
        wait_for_round(client, ban_round)
        merges, complete_round = [0], relay.session.complete_round

        def fill_the_disk(*args: Any, **kwargs: Any) -> dict[str, Any]:
            merges[0] += 1
            if merges[0] == 2:  # (the first call is the first redone round: the open round waits for the undo)
                raise OSError(errno.ENOSPC, "No space left on device")
            return complete_round(*args, **kwargs)

        relay.session.complete_round = fill_the_disk  # type: ignore[method-assign]
        relay.disk.space_returned = lambda: False  # type: ignore[method-assign]  # (it stays full)
        jobs = attacker.assignment(), honest.assignment()
        upload(honest, jobs[1], trained_from)
        upload(attacker, jobs[0], trained_from, poison=True)
        status = wait_until(client, lambda s: bool(s["storage"].get("problem")) and not s["merging"])
        assert status["round"] == 2 and "undos" not in status["counters"]  # round 1 redone, round 2 not yet
    assert relay.store.closed
    relay = restarted(relay, package, directory)  # finishes the undo at start
    assert relay.session.round == ban_round and relay.store.counters()["undos"] == 1
    with serving(relay) as client:
        honest.client = client
        finish(client, honest, trained_from, rounds=1)
    relay = restarted(relay, package, directory)
    with serving(relay) as client:
        honest.client = client
        finish(client, honest, trained_from)
    assert relay.session.done and len(undo_events(relay.session)) == 1
    np.testing.assert_array_equal(relay.session.weights, oracle(package, relay, trained_from).weights)


def test_an_undo_beyond_its_bound_is_partial_and_says_so(package: Package, tmp_path: Path) -> None:
    """With --undo-rounds 1 only the round before the ban is merged again; the attacker's result of round 1 stays
    merged, and the event lists it."""
    ban_round = 3
    relay = make_relay(package, tmp_path / "s", k=2, passes=PASSES, config=CONFIG, undo_rounds=1,
                       verify_fraction=fraction_catching(ban_round), **SCRIPTED)
    trained_from: dict[Key, np.ndarray] = {}
    with serving(relay) as client:
        attacker, honest = HttpPeer(client), HttpPeer(client)
        attack(client, attacker, honest, ban_round, trained_from)
        status = wait_until(client, lambda s: s["counters"].get("undos", 0) == 1 and not s["merging"])
        assert status["counters"]["undos_partial"] == 1 and status["counters"]["rounds_redone"] == 1
        finish(client, honest, trained_from)
    (event,) = undo_events(relay.session)
    assert event["rounds"] == [2] and event["not_redone"] == [1] and event["results"] == 1
    relay.store.open()
    audit = relay.store.audit()
    assert [row["round"] for row in audit if row["peer_id"] == attacker.peer_id and
            not row["verification"].startswith("undone")] == [0, 1]
    np.testing.assert_array_equal(relay.session.weights, oracle(package, relay, trained_from).weights)


def test_a_result_trained_before_the_undo_is_refused_and_its_unit_handed_out_again(package: Package,
                                                                                  tmp_path: Path) -> None:
    """The honest peer still trains the ban round's unit (from weights that held the attacker's results) when the
    undo starts: its upload during the undo is refused ``409 round_redone``, and its unit comes back to it from the
    corrected weights."""
    ban_round = 3
    relay = make_relay(package, tmp_path / "s", k=2, passes=PASSES, config=CONFIG,
                       verify_fraction=fraction_catching(ban_round), **SCRIPTED)
    trained_from: dict[Key, np.ndarray] = {}
    during: list[Any] = []
    with serving(relay) as client:
        attacker, honest = HttpPeer(client), HttpPeer(client)
        attack(client, attacker, honest, ban_round - 1, trained_from)
        wait_for_round(client, ban_round)
        theirs, mine = attacker.assignment(), honest.assignment()
        late = honest.train(mine)  # (not uploaded yet: the upload lands while the undo runs)
        redo = relay.undo.redo_blocking

        def redo_with_an_upload_under_way() -> None:
            during.append(honest.upload(mine["round"], mine["slot"], late))
            redo()

        relay.undo.redo_blocking = redo_with_an_upload_under_way  # type: ignore[method-assign]
        upload(attacker, theirs, trained_from, poison=True)
        status = wait_until(client, lambda s: s["counters"].get("undos", 0) == 1 and not s["merging"])
        assert [r.status_code for r in during] == [409] and during[0].json()["error"] == "round_redone", during
        assert status["counters"]["refused.round_redone"] == 1
        job = honest.work()
        assert job["round"] == ban_round and job["weights_digest"] != mine["weights_digest"]  # the corrected weights
        handed = [job["unit_index"]]
        upload(honest, job, trained_from)
        for _ in range(200):  # (finish, noting the units handed out)
            if session_status(client)["done"]:
                break
            job = honest.work(hold=5)
            if "slot" in job:
                handed.append(job["unit_index"])
                upload(honest, job, trained_from)
    assert relay.session.done and len(undo_events(relay.session)) == 1
    assert mine["unit_index"] in handed, handed  # the refused result's unit was trained again


def held_replays(relay: Relay) -> threading.Event:
    """Hold every host replay of ``relay`` until the returned event is set (the replays then run as they would)."""
    gate = threading.Event()
    assert relay.verification.queue is not None
    replays = relay.verification.queue.verifier.replays
    assert isinstance(replays, LocalReplays)
    train = replays._train

    def held(*args: Any) -> Any:
        assert gate.wait(timeout=120), "the test never released the replays"
        return train(*args)

    replays._train = held  # type: ignore[method-assign]
    return gate


@pytest.mark.parametrize("wait", ["suspects", "all"])
def test_a_round_merges_before_its_routine_replays_and_a_late_failure_undoes_it(package: Package, tmp_path: Path,
                                                                                wait: str) -> None:
    """Every peer's first result is replayed (a routine replay). With --replay-wait suspects round 0 merges while
    both replays are still held; when they end, the attacker's fails, bans it and undoes round 0, and the session
    ends on the honest oracle. With --replay-wait all the round waits, saying it is replaying 2 results."""
    relay = make_relay(package, tmp_path / "s", k=2, passes=PASSES, config=CONFIG, verify_fraction=0.0,
                       replay_wait=wait, **SCRIPTED)
    gate = held_replays(relay)
    trained_from: dict[Key, np.ndarray] = {}
    with serving(relay) as client:
        attacker, honest = HttpPeer(client), HttpPeer(client)
        jobs = attacker.assignment(), honest.assignment()
        upload(honest, jobs[1], trained_from)
        upload(attacker, jobs[0], trained_from, poison=True)
        if wait == "suspects":
            status = wait_for_round(client, 1)  # (merged with both replays held)
            assert status["history"][0]["verification"]["deferred"] == 2 and not status["counters"].get("peers_banned")
        else:
            status = wait_until(client, lambda s: "replaying 2 results" in (s.get("waiting") or ""))
            assert status["round"] == 0
        gate.set()
        status = wait_until(client, lambda s: s["counters"].get("peers_banned", 0) == 1 and not s["merging"] and
                            s["counters"].get("undos", 0) == (1 if wait == "suspects" else 0))
        assert attacker.send(work_call()).status_code == 403
        finish(client, honest, trained_from)
    np.testing.assert_array_equal(relay.session.weights, oracle(package, relay, trained_from).weights)


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_a_second_undo_redoes_rounds_the_first_redid(package: Package, tmp_path: Path, codec: str) -> None:
    """An attacker of three is caught in round 3 and its rounds 1-2 are merged again; then a second peer is banned
    (by the relay's own ban, as a replay's failure would), whose results of rounds 1-2 the first undo kept: the
    second undo merges those rounds again from what the first stored (each result as it stands on the corrected
    weights). Before, it decoded an update the first undo had moved against the corrected weights, failed with
    wrong_base at every try (int8), or took weights trained before the first undo for their update (float32)."""
    # a share that checks slot 0 first in ``ban_round`` and slot 2 in none of the rounds before it
    seed, ban_round, fraction = next((seed, b, f / 1000) for seed in range(50) for b in (3, 2) for f in range(10, 990)
                                     if sampled(seed, b, 0, f / 1000) and not any(
                                         sampled(seed, r, s, f / 1000) for r in range(1, b) for s in (0, 2)))
    relay = make_relay(package, tmp_path / "s", k=3, passes=PASSES, config=CONFIG | {"codec": codec, "seed": seed},
                       verify_fraction=fraction, replay_wait="all", **SCRIPTED)
    trained_from: dict[Key, np.ndarray] = {}
    with serving(relay) as client:
        attacker, honest, other = HttpPeer(client), HttpPeer(client), HttpPeer(client)
        for round_index in range(ban_round + 1):
            jobs = attacker.assignment(), honest.assignment(), other.assignment()
            assert [job["slot"] for job in jobs] == [0, 1, 2] and jobs[0]["round"] == round_index
            upload(honest, jobs[1], trained_from)
            upload(other, jobs[2], trained_from)
            upload(attacker, jobs[0], trained_from, poison=round_index > 0)
            if round_index < ban_round:
                wait_for_round(client, round_index + 1)
        wait_until(client, lambda s: s["counters"].get("undos", 0) == 1 and not s["merging"])
        relay.bans.ban(other.peer_id, "a second ban, of a peer whose results the first undo kept")
        finish(client, honest, trained_from)
        status = session_status(client)
        assert status["done"] and status["counters"]["undos"] == 2, status["counters"]
    # (the first undo's event was in the history entry of a round the second redid: that entry is the second's now)
    second = undo_events(relay.session)[-1]
    assert second["peer"] == other.peer_id and set(range(1, ban_round)) <= set(second["rounds"]), second
