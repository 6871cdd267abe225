"""The asynchronous stream's hand-out order (``server.relay.stream_order``): the first entry of the schedule with no
result and no live lease, found without reading every lease on every ask."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from relay_fixtures import ADMIN_TOKEN
from virtual_clock import Clock

from runtime.protocol import Job
from server.relay.options import RelayOptions
from server.relay.round_mode import SPARE_TURNS
from server.relay.state import Relay
from server.relay.store import open_store
from server.session.config import SessionConfig
from server.session.package import Package
from server.session.session import Session

LEASE = 60.0


def stream_relay(package: Package, directory: Path, clock: Clock) -> Relay:
    """An async session of 4 units x 12 passes (48 entries), a store on ``clock``, no verification, no caps."""
    session = Session.create(package, SessionConfig(participants=2, passes=12, mode="async"), directory=directory)
    return Relay(session=session, package=package, store=open_store(directory / "relay.sqlite3", clock=clock),
                 options=RelayOptions(admin_token=ADMIN_TOKEN, backup_after=None, keep_results=None, verify=False,
                                      lease_seconds=LEASE, peer_timeout=10 * LEASE, ban_addresses=False, join_burst=64,
                                      max_peers_per_address=64))


def test_the_stream_hands_out_in_schedule_order_what_has_no_result_and_no_live_lease(
        package: Package, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries go out in schedule order; one whose lease ran out goes to the next asker before any newer entry, one
    given up (a refused result releases it) at once, one whose result is in never again. Every lease is read once per
    change to the leases (here: one release), not once per ask."""
    clock = Clock()
    relay = stream_relay(package, tmp_path / "s", clock)
    reads: list[Any] = []
    leases = relay.store.leases
    monkeypatch.setattr(relay.store, "leases", lambda *args, **kwargs: reads.append(args) or leases(*args, **kwargs))
    peers = iter([relay.join("127.0.0.1", agent=f"peer {i}")[0] for i in range(40)])

    def ask() -> int:
        answer = relay.next_work(next(peers))
        assert isinstance(answer, Job), answer
        return answer.slot

    assert [ask() for _ in range(3)] == [0, 1, 2]
    clock.advance(LEASE / 2)
    assert [ask() for _ in range(3)] == [3, 4, 5]
    clock.advance(LEASE / 2 + 1)  # (the first three leases ran out; the next three live)
    relay.store.add_arrival(entry=1, unit_index=1, peer_id="late", version=0, num_examples=1, metrics={},
                            message=b"", update=b"")  # (a late result of entry 1 got in before its lease was taken)
    assert [ask() for _ in range(3)] == [0, 2, 6]
    relay.store.release(-1, 4)  # (what a refused result does to its lease)
    assert [ask() for _ in range(3)] == [4, 7, 8]
    assert [ask() for _ in range(20)] == list(range(9, 29))
    assert len([args for args in reads if args[0] == -1]) <= 2, reads  # (once at the start, once after the release)
    relay.close()


def test_a_merge_wakes_as_many_held_requests_as_units_may_go_out(package: Package, tmp_path: Path) -> None:
    """After a merge the stream lets as many held requests look for work as new units may go out before two merges'
    results wait (K = 2: four), and ``SPARE_TURNS`` more; the rest hold on (10,000 held requests woken by each merge
    cost the relay seconds of answers "wait"); once the session is over, every one of them (to learn it)."""
    relay = stream_relay(package, tmp_path / "s", Clock())
    assert relay.mode.units_open() == 4 + SPARE_TURNS
    for entry in range(3):
        relay.store.add_arrival(entry=entry, unit_index=entry, peer_id="p", version=0, num_examples=1, metrics={},
                                message=b"", update=b"")
    assert relay.mode.units_open() == 1 + SPARE_TURNS
    for entry in range(3, 6):
        relay.store.add_arrival(entry=entry, unit_index=entry, peer_id="p", version=0, num_examples=1, metrics={},
                                message=b"", update=b"")
    assert relay.mode.units_open() == SPARE_TURNS
    relay.session.stop("stopped by the test")
    assert relay.mode.units_open() is None  # (every held request wakes to learn that the session is over)
    relay.close()
