"""After a round opens: the held requests it woke get their answers before anything else competes with them, and
the page's samples, generated in the background, never hold back the next merge."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import HttpPeer, make_relay, run_round, serving, session_status

from runtime.protocol import Wait
from server.harness.peer.transport import run_async
from server.relay.status import Samples
from server.relay.store import open_store
from server.session.package import Package


def test_the_next_round_merges_while_the_pages_samples_are_still_generated(
        package: Package, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Text generation for the page's samples can cost several validations; a round of fast units must not wait
    for it to merge. Samples held back (until released) do not hold back the next merges, and once released the
    page shows the samples of the newest weights, generated once more rather than once per merge."""
    release, generated = threading.Event(), []
    original = Samples.generate

    def held_back(session: Any, weights: np.ndarray) -> list[dict[str, Any]]:
        generated.append(session.round)
        release.wait(timeout=60)  # (bounded: the test releases it)
        return original(session, weights)

    monkeypatch.setattr(Samples, "generate", staticmethod(held_back))
    relay = make_relay(package, tmp_path / "session", k=2, passes=2)
    with serving(relay) as client:
        peers = [HttpPeer(client), HttpPeer(client)]
        for _ in range(3):
            status = run_round(client, peers)  # (returns once the round merged)
        assert status["round"] == 3 and status["samples_round"] is None and generated == [1]
        release.set()
        deadline = time.monotonic() + 30
        while session_status(client)["samples_round"] != 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert session_status(client)["samples_round"] == 3 and generated == [1, 3]



def test_the_relay_knows_when_the_requests_a_change_woke_have_their_answers(package: Package, tmp_path: Path) -> None:
    """After a round opens the relay waits for the held requests it woke to have their answers before it starts the
    page's samples (a thread that competes with those answers for the interpreter). Three held requests, one turn:
    one looks for work (every unit is out: it holds on), two hold on at once; the wait ends with all three still
    held, not at the end of their holds. Nothing held: nothing to wait for."""
    relay = make_relay(package, None, k=2, passes=2)

    async def scenario() -> tuple[bool, bool, float, int, list[bool]]:
        notices = relay.notices
        relay.notices.work_changed(available=1)
        nothing_held = await notices.woken_answered(0.0)
        peers = [relay.join("127.0.0.1") for _ in range(5)]
        for peer_id, token in peers[:2]:
            assert not isinstance(await relay.work(peer_id, token), Wait)  # (both units out)
        held = [asyncio.create_task(relay.work(peer_id, token, hold=8.0)) for peer_id, token in peers[2:]]
        parked = time.monotonic() + 30  # (bounded: each held request parks after one pass, however busy the cores)
        while notices.holding < 3 and time.monotonic() < parked:
            await asyncio.sleep(0.01)
        assert notices.holding == 3
        started = time.monotonic()
        notices.work_changed(available=1)
        answered = await notices.woken_answered(5.0)
        waited, holding = time.monotonic() - started, notices.holding
        still = [not task.done() for task in held]
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        return nothing_held, answered, waited, holding, still

    try:
        nothing_held, answered, waited, holding, still = run_async(scenario)
    finally:
        relay.store.close()
    assert nothing_held and answered and waited < 2.0 and holding == 3 and all(still), (answered, waited, holding)




def test_a_change_wakes_as_many_held_requests_as_it_has_turns_the_longest_held_first(package: Package,
                                                                                      tmp_path: Path) -> None:
    """A change with one unit for a held request wakes one request, the one held longest, which looks for work and
    holds on again; the others' holds are left as they are (at 10,000 peers each arrival waiting for its copy woke
    every held request to find no turn and hold on again: 30 % of the relay's event loop). A change with no count
    wakes every one."""
    relay = make_relay(package, None, k=2, passes=2)
    asked: list[str] = []
    looks, holds = relay.next_work, relay.notices.hold_for_work
    held_again: list[float] = []

    def counted(peer_id: str) -> Any:
        asked.append(peer_id)
        return looks(peer_id)

    async def hold_counted(seconds: float) -> bool:
        held_again.append(seconds)
        return await holds(seconds)

    peers = [relay.join("127.0.0.1") for _ in range(10)]
    first, held_ids = peers[2][0], [peer_id for peer_id, _ in peers[2:]]

    async def scenario() -> tuple[list[str], int, list[str], list[str]]:
        notices = relay.notices
        for peer_id, token in peers[:2]:
            assert not isinstance(await relay.work(peer_id, token), Wait)  # (both units out)
        relay.next_work = counted  # type: ignore[method-assign]
        relay.notices.hold_for_work = hold_counted  # type: ignore[method-assign]
        held = []
        for peer_id, token in peers[2:]:  # (held one after another: the first is the longest held)
            held.append(asyncio.create_task(relay.work(peer_id, token, hold=60.0)))
            parked = time.monotonic() + 30  # (bounded: each held request parks after one pass)
            while notices.holding < len(held) and time.monotonic() < parked:
                await asyncio.sleep(0.01)
            assert notices.holding == len(held)
        asked.clear()
        held_again.clear()
        notices.work_changed(available=1)
        assert await notices.woken_answered(5.0)
        one, one_held_again = list(asked), len(held_again)
        asked.clear()
        held_again.clear()
        notices.work_changed(available=0)
        assert await notices.woken_answered(5.0)  # (what a wake without turns woke has held on again by then)
        none = [*asked, *map(str, held_again)]
        notices.work_changed()
        assert await notices.woken_answered(5.0)
        every = list(asked)
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        return one, one_held_again, none, every

    try:
        one, one_held_again, none, every = run_async(scenario)
    finally:
        relay.store.close()
    assert one == [first] and one_held_again == 1, (one, one_held_again)  # (the others were never woken)
    assert none == [] and sorted(every) == sorted(held_ids), (none, every)


def test_a_unit_another_relay_leased_meanwhile_goes_to_nobody_else(package: Package, tmp_path: Path) -> None:
    """Another relay over the same store (here a second store on the relay's SQLite file) leases a unit this relay
    still thinks open: the database refuses this relay's grant, and its peer gets the next open unit, not that one.
    Asynchronous mode the same, on the stream's entries."""
    for mode, extra in (("sync", {}), ("async", {"mode": "async"})):
        relay = make_relay(package, tmp_path / mode, k=3, passes=1, config=extra)
        other = open_store(tmp_path / mode / "relay.sqlite3")
        try:
            with serving(relay) as client:
                first, second = HttpPeer(client), HttpPeer(client)
                held = first.assignment()  # (this relay has read, and keeps, the leases since)
                stolen = held["slot"] + 1
                round_index = -1 if mode == "async" else 0
                assert other.grant(round_index, stolen, stolen, "p-other-relay", 60.0) is not None
                job = second.assignment()
                assert job["slot"] == stolen + 1, (mode, held, job)
                lease = relay.store.leases(round_index)[stolen]
                assert lease.peer_id == "p-other-relay", mode
        finally:
            other.close()
