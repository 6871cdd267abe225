"""Liveness (docs/liveness.md): a session finishes while one peer in good standing is connected. Driven through the
relay's transport-free API on a virtual clock, so a lease's expiry or a peer's silence is an event, not a sleep."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import ADMIN_TOKEN, reference_run
from virtual_clock import Clock

from runtime import wire
from runtime.peer import Peer
from runtime.protocol import Job, Wait
from server.relay.options import RelayOptions
from server.relay.refusal import Refusal
from server.relay.state import Relay
from server.relay.store import open_store
from server.session.config import SessionConfig
from server.session.package import Package
from server.session.session import Session

LEASE = 60.0
TIMEOUT = 10.0


def virtual_relay(package: Package, directory: Path, clock: Clock, *, k: int = 3, passes: int = 2,
                  mode: str = "sync", **options: Any) -> Relay:
    session = Session.create(package, SessionConfig(participants=k, passes=passes, mode=mode), directory=directory)
    return Relay(session=session, package=package, store=open_store(directory / "relay.sqlite3", clock=clock),
                 options=RelayOptions(admin_token=ADMIN_TOKEN, **({"backup_after": None, "keep_results": None,
                                                                  "verify": False, "lease_seconds": LEASE,
                                                                  "peer_timeout": TIMEOUT} | options)))


class Driven:
    """A peer on the relay's API: asks, trains natively, uploads (``change`` may rewrite the upload)."""

    def __init__(self, relay: Relay, package: Package, name: str) -> None:
        self.relay, self.package = relay, package
        self.peer_id, self.token = relay.join("127.0.0.1", agent=name)
        self.trainer = Peer(package.task_description())

    def ask(self) -> dict[str, Any]:
        return self.relay.next_work(self.relay.peer(self.peer_id, self.token))

    def train(self, job: dict[str, Any]) -> bytes:
        self.trainer.set_weights(self.relay.weights_of(job.weights_round))
        return self.trainer.train(job, self.package.chunk_bytes(job.unit_index))

    def step(self) -> dict[str, Any]:
        """Ask; train and upload what it is handed; merge what is ready. Returns the job (or the answer)."""
        job = self.ask()
        if isinstance(job, Job):
            self.relay.submit_result(self.peer_id, job.round, job.slot, self.train(job))
        self.relay.merge_ready()
        return job


def finish(relay: Relay, peers: list[Driven], clock: Clock, limit: int = 400) -> list[str]:
    """Every peer steps in turn; the clock moves on by a second per turn. Returns the reasons peers were told
    to wait (the session must finish within ``limit`` turns)."""
    reasons = []
    for _ in range(limit):
        if relay.session.done:
            return reasons
        for peer in peers:
            answer = peer.step()
            if isinstance(answer, Wait):
                reasons.append(answer.reason)
        clock.now += 1.0
    raise AssertionError(f"the session did not finish: {relay.status()['round_progress']}, {relay.waiting()}")


def merged_units(relay: Relay) -> Counter[tuple[int, int]]:
    """(pass, unit) of every merged result, from the relay's audit rows of each merged round."""
    plan = relay.session.plan
    per_pass = Counter(unit for _, unit in plan.schedule)
    seen: Counter[int] = Counter()
    for entry in relay.session.history:
        for unit in entry["units"]:
            seen[unit] += 1
    assert all(seen[unit] == per_pass[unit] for unit in per_pass), (seen, per_pass)
    return Counter({(0, unit): count for unit, count in seen.items()})


def test_one_peer_alone_finishes_a_default_session(package: Package, tmp_path: Path) -> None:
    """No start gate unless the host sets one: the default k = 3 with one peer trains every slot in turn."""
    clock = Clock()
    relay = virtual_relay(package, tmp_path / "s", clock)
    assert relay.options.min_peers == 1
    alone = Driven(relay, package, "alone")
    assert relay.waiting() is None  # a peer asking now is handed work
    assert finish(relay, [alone], clock) == []  # never told to wait
    assert np.array_equal(relay.session.weights, reference_run(package, SessionConfig(participants=3, passes=2)))
    merged_units(relay)
    relay.close()


def test_the_host_gate_says_what_it_waits_for(package: Package, tmp_path: Path) -> None:
    clock = Clock()
    relay = virtual_relay(package, tmp_path / "s", clock, min_peers=2)
    first = Driven(relay, package, "first")
    answer = first.ask()
    assert answer.reason == relay.status()["waiting"] == \
        "waiting for 1 more peer to start round 1 (1/2 connected; the host asked for --min-peers 2)"
    Driven(relay, package, "second")
    assert isinstance(first.ask(), Job) and relay.status()["peers"]["needed"] == 2
    relay.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_peer_that_leaves_in_round_three_holds_nothing_up(package: Package, tmp_path: Path, mode: str) -> None:
    """k = 3, three peers; one takes a unit of round 3 and never comes back: the others finish the session once
    its lease runs out, and every unit is merged once per pass."""
    clock = Clock()
    relay = virtual_relay(package, tmp_path / "s", clock, k=2, passes=3, mode=mode)
    peers = [Driven(relay, package, f"peer {i}") for i in range(3)]
    leaving = peers[2]
    for _ in range(100):
        if relay.session.round >= 2:
            break
        for peer in peers:
            peer.step()
        clock.now += 1.0
    taken = leaving.ask()  # round 3 (async: the stream's next unit) and then silence
    assert isinstance(taken, Job)
    stayed = peers[:2]
    reasons = finish(relay, stayed, clock)
    assert any("out with peers" in r or "waiting for results" in r or "waiting for other peers" in r
               for r in reasons), reasons
    assert relay.store.counters()["leases_expired"] >= 1
    units = Counter(unit for entry in relay.session.history for unit in entry["units"])
    assert units == Counter(unit for _, unit in relay.session.plan.schedule)
    if mode == "sync":
        assert np.array_equal(relay.session.weights, reference_run(package, SessionConfig(participants=2, passes=3)))
    relay.close()


def claim_more(body: bytes) -> bytes:
    """The result with a claimed example count past what its unit holds (a lie the relay can check)."""
    header, vector = wire.decode(body)
    return wire.encode(vector, dataclasses.replace(header, num_examples=header.num_examples * 10 + 1))


def test_a_banned_peer_is_not_connected_and_its_lease_goes_at_once(package: Package, tmp_path: Path) -> None:
    clock = Clock()
    relay = virtual_relay(package, tmp_path / "s", clock, min_peers=2)
    honest, liar = Driven(relay, package, "honest"), Driven(relay, package, "liar")
    job = liar.ask()
    with pytest.raises(Refusal) as refused:
        relay.submit_result(liar.peer_id, job.round, job.slot, claim_more(liar.train(job)))
    assert refused.value.code == "num_examples_claim" and relay.store.ban_reason(liar.peer_id)
    assert relay.status()["peers"]["connected"] == 1  # the banned peer no longer counts
    assert finish(relay, [honest], clock) == []  # the gate of 2 was passed in round 1; no later round waits
    assert np.array_equal(relay.session.weights, reference_run(package, SessionConfig(participants=3, passes=2)))
    relay.close()


def test_a_ban_releases_the_banned_peers_live_lease(package: Package, tmp_path: Path) -> None:
    clock = Clock()
    relay = virtual_relay(package, tmp_path / "s", clock, k=2)
    honest, liar = Driven(relay, package, "honest"), Driven(relay, package, "liar")
    held = liar.ask()
    relay.bans.ban(liar.peer_id, "a test's ban")  # (what a failed replay does)
    assert relay.store.counters()["leases_released_by_ban"] == 1
    job = honest.ask()
    assert job.slot == held.slot  # at once, not after the lease's 60 s
    relay.close()


def test_a_slot_refused_to_every_connected_peer_is_carried(package: Package, tmp_path: Path) -> None:
    """One peer, k = 3: its second result of round 1 is refused (an example claim it did not mean: the test's
    rewrite). Nobody else is connected to take that slot, so the round merges without it once the third is in,
    and the unit opens round 2; every unit is still merged once per pass."""
    clock = Clock()
    relay = virtual_relay(package, tmp_path / "s", clock, passes=1, verify=False)
    alone = Driven(relay, package, "alone")
    alone.step()
    job = alone.ask()
    trained = alone.train(job)
    header, vector = wire.decode(trained)
    with pytest.raises(Refusal) as refused:
        relay.submit_result(alone.peer_id, job.round, job.slot,
                            wire.encode(np.full_like(vector, 1e6), header))
    assert refused.value.code == "update_norm"
    assert relay.mode.blocked_slots() == {job.slot}
    third = alone.ask()
    assert third.slot != job.slot  # another slot: the refused one is not handed back while others are open
    relay.submit_result(alone.peer_id, third.round, third.slot, alone.train(third))
    assert relay.merge_ready(), "the round merged without its blocked slot"
    entry = relay.session.history[0]
    assert entry["carried"] == entry["blocked"] == [job.unit_index]
    assert relay.store.counters()["units_carried_when_refused"] == 1
    finish(relay, [alone], clock)
    assert Counter(u for e in relay.session.history for u in e["units"]) == \
        Counter(u for _, u in relay.session.plan.schedule)
    relay.close()


def test_a_round_with_no_result_hands_a_blocked_slot_back(package: Package, tmp_path: Path) -> None:
    clock = Clock()
    relay = virtual_relay(package, tmp_path / "s", clock, k=1, passes=1)
    alone = Driven(relay, package, "alone")
    job = alone.ask()
    header, vector = wire.decode(alone.train(job))
    with pytest.raises(Refusal):
        relay.submit_result(alone.peer_id, job.round, job.slot, wire.encode(np.full_like(vector, 1e6), header))
    again = alone.ask()
    assert again.slot == job.slot  # nobody else connected, and nothing to merge without it
    finish(relay, [alone], clock)
    relay.close()
