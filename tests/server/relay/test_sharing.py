"""Two relays serving one asynchronous session together over one PostgreSQL store and one session folder
(``server.relay.sharing``): peers ask one relay for work and send their results to the other, the holder merges
what reached either, the replica follows its checkpoints and refuses the host's changes, and when the holder stops
the replica takes the session over and finishes it; the weights are the recorded arrivals' replay, bit for bit."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import (
    ADMIN_TOKEN,
    HttpPeer,
    make_relay,
    recorded_arrivals,
    replayed_arrivals,
    serving,
    session_status,
)
from relay_process import wait_for

from server.relay.state import Relay
from server.relay.store import open_store
from server.session.package import Package
from server.session.session import Session

TURNS = 60  # a bound on the peers' turns (the session needs 6 rounds of three uploads)
WAIT_SECONDS = 30.0  # the bound on each wait for what a relay does in the background


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """6 chunks of 256 rows (the ``package`` fixture of conftest.py builds it once for this module)."""
    return {"examples": 1536, "chunks": 6}


class RoundsLogged:
    """A session's metrics log (``RoundLog``) that notes what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def begin(self, session: Any, *, new: bool) -> None:
        self.calls.append(("begin new" if new else "begin", session.round))

    def follow(self, session: Any) -> None:
        self.calls.append(("follow", session.round))

    def close(self) -> None:
        self.calls.append(("close", -1))


def replica_of(relay: Relay, url: str, log: RoundsLogged) -> Relay:
    """A second relay over the same store and session folder, as ``serve`` starts one while another holds it."""
    assert relay.session.directory is not None
    session = Session.restore(relay.session.directory, relay.package, round_log=log, read_only=True)
    return Relay(session=session, package=relay.package, store=open_store(url), options=relay.options, replica=True)


def turn(peers: list[HttpPeer], relays: list[Any], turn_index: int) -> int:
    """Each peer asks one relay for work and sends its result to the other (who asks where moves on every turn);
    returns how many results were accepted."""
    accepted = 0
    for index, peer in enumerate(peers):
        ask, send = relays[(turn_index + index) % len(relays)], relays[(turn_index + index + 1) % len(relays)]
        peer.client = ask
        job = peer.work()
        if "slot" not in job:
            continue
        body = peer.train(job)
        peer.client = send
        answer = peer.upload(job["round"], job["slot"], body)
        assert answer.status_code == 200, (answer.text, job)
        accepted += 1
        if accepted == 1 and len(relays) > 1:  # (the same result again, at the relay that asked: refused)
            peer.client = ask
            again = peer.upload(job["round"], job["slot"], body)
            assert again.status_code == 409 and again.json()["error"] == "duplicate", (again.status_code, again.text)
    return accepted


@pytest.mark.timeout(300)
def test_two_relays_serve_one_async_session_and_the_replica_takes_it_over_when_the_holder_stops(
        package: Package, tmp_path: Path, postgresql_url: str) -> None:
    holder = make_relay(package, tmp_path / "s", k=2, passes=2, config={"mode": "async"}, store=postgresql_url,
                        ban_addresses=False)
    log = RoundsLogged()
    replica = replica_of(holder, postgresql_url, log)
    assert holder.store.shared and replica.store.shared
    with contextlib.ExitStack() as holding, serving(replica) as b:
        a = holding.enter_context(serving(holder))
        peers = [HttpPeer(a), HttpPeer(b), HttpPeer(a)]  # (joined at either relay: the store knows them all)
        for index in range(TURNS):
            turn(peers, [a, b], index)
            if holder.session.round >= 2:
                break
        wait_for("the holder to merge what is ready", lambda: not holder.merging and not holder.round_ready(),
                 time.monotonic() + WAIT_SECONDS)
        wait_for("the replica to follow the holder's checkpoints",
                 lambda: replica.session.round == holder.session.round, time.monotonic() + WAIT_SECONDS)
        assert replica.sharing.followed >= 1 and not replica.merges.lock.locked()
        np.testing.assert_array_equal(replica.session.weights, holder.session.weights)
        assert len(replica.session.history) == holder.session.round
        paused = b.post("/api/admin/pause", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert paused.status_code == 409 and paused.json()["error"] == "replica", paused.text
        assert not replica.paused and not holder.paused
        merged_by_holder = holder.session.round
        holding.close()  # the holder stops (its lifespan closes it): the replica serves alone, then holds
        if not replica.store.buffered():  # (one result the replica takes and does not merge: it never merges)
            assert turn(peers[:1], [b], 0) == 1
        waiting = [row[0] for row in replica.store.buffered()]
        replica.store.mark_merged(waiting, holder.session.round)  # (as a merge killed before its checkpoint)
        assert replica.store.buffered_count() == 0 and not replica.round_ready()
        replica.sharing.take_hold = lambda: True  # (``serve`` hands it the hold's take: its holder is gone)
        wait_for("the replica to take the session over", lambda: not replica.context.replica,
                 time.monotonic() + WAIT_SECONDS)
        assert log.calls[0] == ("begin", holder.session.round)  # (its metrics sinks write from the takeover on)
        for peer in peers:
            peer.client = b
        for index in range(TURNS):
            if session_status(b)["done"]:
                break
            turn(peers, [b], index)
        else:
            raise AssertionError(f"the session did not finish: {session_status(b)}")
        counters = session_status(b)["counters"]
    assert replica.session.done and replica.session.round > merged_by_holder
    taken_at = log.calls[0][1]  # (one follow a merge of the replica's from there, and the close: the last merge's
    calls = [call for call, _ in log.calls[1:]]  # follow may come after it, the session done as its checkpoint goes)
    assert sorted(calls) == ["close"] + ["follow"] * (replica.session.round - taken_at), calls
    assert counters["takeovers"] == 1 and counters.get("refused.not_leased", 0) == 0
    assert counters["arrivals_returned_to_buffer_on_takeover"] == len(waiting) >= 1
    arrivals = recorded_arrivals(postgresql_url)
    assert sorted(x.entry for x in arrivals) == list(range(len(replica.session.plan.schedule)))  # each unit once
    replayed = replayed_arrivals(package, replica.session.config, arrivals)
    np.testing.assert_array_equal(replayed, replica.session.weights)  # the recorded arrivals, bit for bit
