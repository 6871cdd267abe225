"""Round deadlines (``serve --round-deadline S --min-results M``): a round merges what it has at its deadline,
the units not back open the next round, every unit is still trained once per pass, and a result that comes
after its round merged without it is refused."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import (
    HttpPeer,
    make_relay,
    replay,
    serving,
    session_status,
    wait_until,
    work_until_done,
)

from server.session.package import Package


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """6 chunks of 256 rows (the ``package`` fixture of conftest.py builds it once for this module)."""
    return {"examples": 1536, "chunks": 6}


def test_a_round_merges_at_its_deadline_and_carries_the_missing_unit(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=3, passes=2, round_deadline=1.0, min_results=2,
                       ban_addresses=False)
    planned = relay.session.num_rounds
    with serving(relay) as client:
        peers = [HttpPeer(client) for _ in range(3)]
        jobs = [peer.assignment() for peer in peers]
        slow_result = peers[2].train(jobs[2])
        opened = time.time()
        for peer, job in zip(peers[:2], jobs[:2], strict=True):
            assert peer.train_and_upload(job).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"], timeout=20)
        assert time.time() - opened >= 0.9  # merged by the deadline, not by a full round
        entry = status["history"][0]
        assert entry["participants"] == 2 and entry["carried"] == [jobs[2]["unit_index"]]
        assert entry["deadline"]["results"] == 2 and entry["deadline"]["min_results"] == 2
        late = peers[2].upload(0, jobs[2]["slot"], slow_result)
        assert (late.status_code, late.json()["error"]) == (409, "stale_round")
        carried = peers[2].assignment()  # the next round opens with the carried unit, saying where it came from
        assert (carried["slot"], carried["unit_index"], carried["carried_from"]) == (0, jobs[2]["unit_index"], 0)
        assert status["num_rounds"] == planned + 1  # 12 units in rounds of 3, and one round was short
        assert peers[2].train_and_upload(carried).status_code == 200
        work_until_done(client, peers)
        final = session_status(client)
    relay.open()
    history = final["history"]
    assert history[1]["carried_in"] == [{"unit": jobs[2]["unit_index"], "from_round": 0}]
    units = sorted(u for e in history for u in e["units"])
    assert units == sorted(list(range(6)) * 2)  # every unit once per pass, none lost, none twice
    # the relay's merges are the session's: replaying the stored results gives the same weights
    np.testing.assert_array_equal(replay(package, relay.session.config, relay.store.all_results()).weights,
                                  relay.session.weights)


def test_a_round_short_of_its_minimum_waits_for_it(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "s", k=3, passes=1, round_deadline=0.5, min_results=2,
                       ban_addresses=False)
    with serving(relay) as client:
        peers = [HttpPeer(client) for _ in range(3)]
        jobs = [peer.assignment() for peer in peers]
        assert peers[0].train_and_upload(jobs[0]).status_code == 200
        time.sleep(1.0)
        assert session_status(client)["round"] == 0  # past the deadline with 1 of the 2 results it needs
        assert peers[1].train_and_upload(jobs[1]).status_code == 200
        status = wait_until(client, lambda s: s["round"] >= 1 and not s["merging"])
        assert status["history"][0]["participants"] == 2


def test_serve_refuses_a_bad_deadline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli import main

    assert main(["serve", "--port", "0", "--round-deadline", "0", "--session-dir", str(tmp_path / "s")]) == 2
    assert "--round-deadline must be a number of seconds above 0" in capsys.readouterr().err
