"""Slow peers on a virtual clock (``server.simulation.stragglers``, ``simulate --peer-speeds``, ``bench stragglers``):
the relay's own backups and deadlines decide, the virtual times show what they bought, and the weights are those
of an in-process session wherever no deadline moved a unit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import EXAMPLE, reference_run

from server import cli
from server.session.package import Package
from server.session.session import Session, SessionConfig
from server.simulation.simulator import run_round
from server.simulation.stragglers import Profile, StragglerSettings, parse_profile, simulate_stragglers

UNIT = 10.0


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """6 chunks of 256 rows (the ``package`` fixture of conftest.py builds it once for this module)."""
    return {"examples": 1536, "chunks": 6}


def simulate(package: Package, tmp_path: Path, profile: str = "equal", *, k: int = 3, passes: int = 2,
             **settings: object):
    config = SessionConfig(participants=k, passes=passes)
    return simulate_stragglers(package, config, StragglerSettings(profile=parse_profile(profile), unit_seconds=UNIT,
                                                                  **settings),  # type: ignore[arg-type]
                               tmp_path / "relay")


def test_backups_win_the_race_against_a_4x_slow_peer_on_the_virtual_clock(package: Package, tmp_path: Path) -> None:
    without = simulate(package, tmp_path, "one-slow:4", backup_after=None)
    with_backups = simulate(package, tmp_path, "one-slow:4", backup_after=1.0)
    assert without.factors == [4.0, 1.0, 1.0] and without.done and with_backups.done
    assert without.virtual_seconds == pytest.approx(4 * 4 * UNIT, abs=1.0)  # 4 rounds, each waits for the slow unit
    assert with_backups.backups_won >= 2 and with_backups.virtual_seconds < 0.6 * without.virtual_seconds
    assert with_backups.units_done > with_backups.units_merged  # the slow originals were trained for nothing
    config = SessionConfig(participants=3, passes=2)
    reference = reference_run(package, config)  # a backup trains the same unit from the same weights: same bits
    np.testing.assert_array_equal(without.weights, reference)
    np.testing.assert_array_equal(with_backups.weights, reference)
    assert with_backups.time_to(without.final_metric) == with_backups.virtual_seconds


def test_a_deadline_carries_the_slow_unit_and_every_unit_is_trained_once_per_pass(package: Package,
                                                                                  tmp_path: Path) -> None:
    run = simulate(package, tmp_path, "one-slow:4", backup_after=None, round_deadline=1.5 * UNIT)
    assert run.done and run.units_carried >= 1 and run.rounds > run.planned_rounds
    merged = sorted(unit for entry in run.history for unit in entry["units"])
    assert merged == sorted(list(range(6)) * 2)  # none lost, none twice
    assert any(entry.get("carried") for entry in run.history)
    assert run.refused.get("stale_round", 0) >= 1  # the slow peer's units came after their round merged
    first = run.history[0]
    assert first["participants"] == 2 and first["deadline"]["results"] == 2


def test_the_simulation_is_deterministic(package: Package, tmp_path: Path) -> None:
    runs = [simulate(package, tmp_path / str(i), "lognormal:0.5", seed=3) for i in range(2)]
    assert runs[0].timeline == runs[1].timeline and runs[0].factors == runs[1].factors
    assert runs[0].virtual_seconds == runs[1].virtual_seconds and runs[0].refused == runs[1].refused
    np.testing.assert_array_equal(runs[0].weights, runs[1].weights)
    assert simulate(package, tmp_path / "other", "lognormal:0.5", seed=4).factors != runs[0].factors


def test_equal_peers_in_sync_end_on_the_simulators_weights(package: Package, tmp_path: Path) -> None:
    run = simulate(package, tmp_path, "equal", backup_after=None, peers=4)
    config = SessionConfig(participants=3, passes=2)
    session = Session.create(package, config)
    while not session.done:
        run_round(session)  # server.simulation.simulator
    np.testing.assert_array_equal(run.weights, session.weights)
    np.testing.assert_array_equal(run.weights, reference_run(package, config))
    assert run.rounds == session.round and run.virtual_seconds == pytest.approx(session.round * UNIT, abs=1.0)
    assert [entry["metrics"] for entry in run.history] == [entry["metrics"] for entry in session.history]


def test_a_vanished_peer_holds_its_unit_until_the_lease_expires_unless_a_backup_takes_it(package: Package,
                                                                                         tmp_path: Path) -> None:
    without = simulate(package, tmp_path, "dropout:0.2", backup_after=None, lease_seconds=60.0)
    with_backups = simulate(package, tmp_path, "dropout:0.2", backup_after=1.0, lease_seconds=60.0)
    assert len(without.dropouts) == 1 and without.done and with_backups.done
    assert without.counters.get("leases_expired", 0) == 1  # the unit went to another peer after its lease
    assert without.virtual_seconds >= 60.0 and with_backups.virtual_seconds < without.virtual_seconds


def test_the_relays_async_mode_does_not_wait_for_the_slow_peer(package: Package, tmp_path: Path) -> None:
    config = SessionConfig(participants=3, passes=2, mode="async")
    settings = StragglerSettings(profile=parse_profile("one-slow:4"), unit_seconds=UNIT)
    run = simulate_stragglers(package, config, settings, tmp_path / "async")
    sync = simulate(package, tmp_path, "one-slow:4", backup_after=None)
    assert run.done and run.virtual_seconds < sync.virtual_seconds and run.units_done == run.units_merged == 12
    assert sorted(unit for entry in run.history for unit in entry["units"]) == sorted(list(range(6)) * 2)
    assert max(s for entry in run.history for s in entry["staleness"]) >= 1  # the slow peer's results came late


def test_profiles_parse_and_refuse() -> None:
    assert parse_profile("one-slow") == Profile("one-slow", 4.0) and parse_profile("equal") == Profile("equal")
    assert parse_profile("dropout:0.5").dropouts(4, 0) == parse_profile("dropout:0.5").dropouts(4, 0)
    assert len(parse_profile("dropout:0.5").dropouts(4, 0)) == 2
    for bad in ("fast", "one-slow:0.5", "dropout:0", "lognormal:x", "equal:2"):
        with pytest.raises(ValueError):
            parse_profile(bad)


def test_simulate_peer_speeds_prints_rounds_and_virtual_times(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--task", str(EXAMPLE), "--set", "chunks=4", "--set", "examples=1024", "--set", "epochs=2",
            "-k", "2", "--passes", "1", "--merge", "fedavg", "--aggregate", "mean", "--out", str(tmp_path),
            "--peer-speeds", "one-slow:3", "--peers", "3", "--unit-seconds", "5", "--target", "0"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "round 1/2 at" in out and "virtual s" in out and "backups" in out and "never reached" in out
    summary = json.loads((tmp_path / "fedavg" / "stragglers.json").read_text())
    assert summary["factors"] == [3.0, 1.0, 1.0] and summary["rounds"] == 2
    assert (tmp_path / "fedavg" / "history.jsonl").is_file()
    assert cli.main(["simulate", "--task", str(EXAMPLE), "--no-backups", "--out", str(tmp_path)]) == 2
    assert "only apply with --peer-speeds" in capsys.readouterr().err
    assert cli.main(args + ["--peer-speeds", "sometimes"]) == 2
    assert "unknown peer-speed profile" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_stragglers_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "stragglers.json"
    assert cli.main(["bench", "stragglers", "--quick", "--modes", "backups", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    by = {(r["profile"], r["mode"]): r for r in rows}
    assert set(by) == {(p, m) for p in ("equal", "one-slow:4") for m in ("sync", "backups")}
    assert by[("equal", "sync")]["ratio"] == 1.0
    assert by[("one-slow:4", "backups")]["ratio"] < by[("one-slow:4", "sync")]["ratio"]
    assert "goal (arith)" in capsys.readouterr().out
