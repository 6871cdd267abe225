"""``peertrain bench crowd``: its figures from a synthetic timeline by hand, and (slow) a small crowd end to end on a
real relay."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from relay_fixtures import REPO_ROOT

from server.bench.crowd_clients import Slice, merge_slice, slices
from server.bench.crowd_figures import (
    Figures,
    Lie,
    Timeline,
    async_units_lost,
    count_liars,
    lost,
    relay_own_seconds,
    summarize,
)
from server.relay.store import StoredResult, open_store
from server.relay.store.records import ASYNC_ROUND


def status_of(history: list[dict]) -> dict:
    return {"history": history, "counters": {"refused.late": 2, "results_accepted": 9}}


def entry(round_index: int, units: list[int], validate: float, carried: list[int] | None = None) -> dict:
    return {"round": round_index, "units": units, "seconds": {"merge": 0.01, "validate": validate},
            **({"carried": carried} if carried else {})}


def test_the_relays_time_after_the_last_result_and_the_units_lost_by_hand() -> None:
    """k = 2: round 1's last result answered at t = 10.0, round 2's second assignment reached its peer at 10.9, the
    history says round 1 validated for 0.5 s: the relay's own time is 0.4 s. A unit handed out in round 2 that the
    history neither merged nor carried is lost."""
    timeline = Timeline()
    timeline.jobs = [(0, 0, 1.0), (0, 1, 1.0), (1, 2, 5.0), (1, 3, 5.1), (2, 4, 10.5), (2, 5, 10.9), (3, 6, 20.0),
                     (3, 7, 20.0)]
    timeline.results = [(0, 0, 2.0, 2.1), (0, 1, 2.0, 2.2), (1, 2, 9.0, 9.5), (1, 3, 9.0, 10.0), (2, 4, 15.0, 15.2)]
    timeline.work_seconds = [0.01, 0.02, 0.03]
    history = [entry(0, [0, 1], 0.3), entry(1, [2, 3], 0.5), entry(2, [4], 0.2, carried=[]), entry(3, [6, 7], 0.1)]
    figures = Figures(setting="sync k=2", k=2, peers=2, units=8)
    summarize(figures, timeline, status_of(history), rounds=2)
    assert figures.relay_after_last[0] == pytest.approx(10.9 - 10.0 - 0.5)
    assert len(figures.relay_after_last) == 2  # (rounds 1 and 2: round 0 waits for the crowd to join)
    assert figures.relay_after_last[1] == pytest.approx(20.0 - 15.2 - 0.2)
    assert figures.first_after_last == pytest.approx([10.5 - 10.0 - 0.5, 20.0 - 15.2 - 0.2])  # (the first of round 2's)
    assert figures.units_lost == 1  # unit 5: handed out in round 2, neither merged nor carried
    assert figures.refusals == {"late": 2} and figures.rounds == 4
    assert figures.results_per_second == pytest.approx(5 / (15.2 - 2.0))
    assert figures.work_p50_ms == pytest.approx(20.0)
    history[2]["carried"] = [5]
    again = Figures(setting="sync k=2", k=2, peers=2, units=8)
    summarize(again, timeline, status_of(history), rounds=2)
    assert again.units_lost == 0


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_async_units_lost_by_hand(tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    """Async: the crowd had honest results accepted for entries 0-4 (entry 1's first from a liar, whose later copy
    an honest peer sent, does not count; entry 6's first came from a liar) and the store, read after the relay
    stopped, holds 0 merged, 2 waiting and 3 in a dispute a liar's copy opened: entry 4 went nowhere."""
    location = request.getfixturevalue("postgresql_url") if kind == "postgresql" else str(tmp_path / "relay.sqlite3")
    timeline = Timeline()
    timeline.accepted = [("p-a", 0, 0), ("p-liar", 0, 1), ("p-b", 0, 1), ("p-b", 0, 2), ("p-a", 1, 3), ("p-b", 1, 4),
                         ("p-liar", 1, 6)]
    figures = Figures(setting="async K=2", k=2, peers=3, units=8)
    status = {"round": 2, "mode": "async", "counters": {}}
    honest = count_liars(figures, {"p-a": None, "p-b": None, "p-liar": Lie("flip", 1)}, [], timeline, status)
    assert honest == {0, 2, 3, 4}
    store = open_store(location)
    try:
        seqs = [store.add_arrival(entry=entry, unit_index=entry, peer_id=peer, version=0, num_examples=1, metrics={},
                                  message=b"m", update=b"u") for entry, peer in ((0, "p-a"), (2, "p-b"))]
        store.mark_merged(seqs[:1], 0)  # (entry 0 merged, entry 2 waits)
        store.add_copy(ASYNC_ROUND, 3, "p-liar", b"m", "unresolved")
    finally:
        store.close()
    assert async_units_lost(location, honest) == 1
    figures.units_lost, figures.units_checked = 1, len(honest)
    assert lost(figures, "-") == "1 of 4"
    assert async_units_lost(location, honest - {4}) == 0
    assert async_units_lost(tmp_path / "none.sqlite3", honest) is None  # (no store: not measured)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_the_relays_own_time_from_its_store_by_hand(tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    """Round 1's last result stored at 10.2 and its last copy at 10.4; round 2's first lease granted at 10.7 (a copy's
    lease at 10.5 does not count); round 1 validated for 0.1 s: 10.7 - 10.4 - 0.1 = 0.2 s. Round 2 has no round 3.
    Read from either store, after the relay stopped."""
    location = request.getfixturevalue("postgresql_url") if kind == "postgresql" else str(tmp_path / "relay.sqlite3")
    now = [0.0]
    store = open_store(location, clock=lambda: now[0])
    try:
        def at(seconds: float, write: Callable[[], object]) -> None:
            now[0] = seconds
            write()

        at(9.0, lambda: store.grant(1, 0, 0, "p-a", 30.0))
        for slot, seconds in enumerate((10.0, 10.2)):
            at(seconds, lambda slot=slot: store.add_result(StoredResult(1, slot, slot, "p-a", 1, {}, b"m")))
        at(12.0, lambda: store.add_result(StoredResult(2, 0, 0, "p-a", 1, {}, b"m")))
        at(10.4, lambda: store.add_copy(1, 0, "p-b", b"m", "identical"))
        at(11.0, lambda: store.add_copy(1, 1, "p-b", b"m", "identical"))  # (a copy after the merge)
        for slot, copy, seconds in ((0, 0, 10.9), (1, 0, 10.7), (2, 1, 10.5)):
            at(seconds, lambda slot=slot, copy=copy: store.grant(2, slot, slot, "p-c", 30.0, copy=copy))
    finally:
        store.close()
    assert relay_own_seconds(location, {1: 0.1}) == pytest.approx([0.2])
    assert relay_own_seconds(location, {1: 0.1, 2: 0.1}) == pytest.approx([0.2])
    assert relay_own_seconds(tmp_path / "none.sqlite3", {1: 0.1}) == []


def test_the_crowd_cut_into_slices_and_a_slices_report_merged_by_hand() -> None:
    liar = Lie("flip", 1)
    lies: list[Lie | None] = [liar, None, None, None, None, Lie("free_rider", 2), None, None, None, None]
    parts = slices(10, 4, lies, 3)
    assert [(part.first, len(part.lies), part.addresses) for part in parts] == [
        (0, 3, range(2, 3)), (3, 4, range(3, 5)), (7, 3, range(5, 6))]  # (127.0.0.2 on, each slice its own)
    assert sum((part.lies for part in parts), []) == lies
    assert Slice.from_json(json.loads(json.dumps(parts[1].to_json()))) == parts[1]
    assert [part.addresses for part in slices(3, 1, [None] * 3, 2)] == [range(2, 3)] * 2  # (one address each, shared)
    timeline = Timeline(jobs=[(0, 1, 1.0)], refusals={"banned": 1})
    by_peer: dict[str | None, Lie | None] = {"p-a": None}
    report = {"timeline": {"jobs": [[0, 2, 1.5]], "results": [[0, 2, 2.0, 2.1]], "accepted": [["p-b", 0, 2]],
                           "work_seconds": [0.01], "errors": [], "refusals": {"banned": 2, "duplicate": 1}},
              "peers": [["p-b", ["flip", 1]]], "cpu_seconds": 1.5}
    assert merge_slice(timeline, by_peer, report) == 1.5
    assert timeline.jobs == [(0, 1, 1.0), (0, 2, 1.5)] and timeline.accepted == [("p-b", 0, 2)]
    assert timeline.refusals == {"banned": 3, "duplicate": 1} and by_peer == {"p-a": None, "p-b": liar}


@pytest.mark.slow
def test_a_small_crowd_on_a_real_relay_loses_nothing_and_reports_every_setting(tmp_path: Path) -> None:
    """The crowd in two processes (the bench's and a slice's: ``--client-processes 2``)."""
    out = tmp_path / "crowd.json"
    command = [sys.executable, "-m", "server.cli", "bench", "crowd", "--peers", "12", "--ks", "8", "--async-k", "4",
               "--async-merges", "2", "--async-seconds", "300", "--rounds", "2", "--addresses", "4", "--skip-browser",
               "--skip-training", "--liars", "0.25", "--client-processes", "2", "--floor-seconds", "1", "--out",
               str(out)]  # (async: until 2 merges are in)
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = {r["setting"]: r for r in json.loads(out.read_text())["results"]}
    assert list(results) == ["sync k=5", "sync k=8", "async K=4"]
    for name, figures in results.items():
        assert figures["units_lost"] == 0, name
        assert not figures["errors"] and figures["results_per_second"] > 0, name
        assert figures["peak_rss_mb"] > 0 and figures["honest_banned"] == 0, name
        assert figures["relay_cpu_seconds"] > 0 and figures["crowd_cpu_seconds"] > 0, name  # (both ends' CPU)
        # a ban's undo refuses the results of the round it starts again (round_redone, stale_round, not_leased)
        assert set(figures["refusals"]) <= {"banned", "round_redone", "stale_round", "not_leased", "duplicate",
                                            "past_deadline"}, \
            figures["refusals"]  # (duplicate: a copy that came after its slot's third result settled a dispute;
        # past_deadline: a copy that came while its round merged, which a loaded host makes likelier)
        assert figures["liars"] == (0 if name == "sync k=5" else 3), name
        assert math.isfinite(figures["result_p50_ms"]) and figures["result_p99_ms"] >= figures["result_p50_ms"]
    for name in ("sync k=5", "sync k=8"):
        assert len(results[name]["relay_after_last"]) == 2 and results[name]["relay_seconds"] > 0, results[name]
    assert results["async K=4"]["rounds"] >= 2 and results["sync k=8"]["peers"] == 12
    # every liar with a result in a merged round was caught: its first result was copied (a newcomer's), the copy
    # disagreed, a third peer's result settled it
    crowd = results["sync k=8"]
    assert crowd["liars_banned"] == crowd["liars_accepted"] and crowd["copies_accepted"] > 0, crowd
    # async: the merges wait for the copies of every newcomer's result (no liar's result merges unchecked)
    assert results["async K=4"]["copies_accepted"] > 0, results["async K=4"]
    # ... as the relay's audit rows of what merged say (sync: counted, an undo's taken out)
    assert results["async K=4"]["lies_merged"] == 0 and isinstance(crowd["lies_merged"], int), results
    assert "| sync k=8 | 12 | 8 |" in done.stdout
    # the async rate beside this machine's floor, measured in the same run before the setting
    floor = results["async K=4"]["floor_per_second"]
    assert floor > 0 and results["sync k=8"]["floor_per_second"] is None, results
    assert f"x this machine's floor ({floor:.0f} uploads/s" in done.stdout, done.stdout[-2000:]


def test_two_relays_need_a_shared_store() -> None:
    command = [sys.executable, "-m", "server.cli", "bench", "crowd", "--relays", "2", "--skip-browser"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--store postgresql://" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_small_crowd_on_two_relays_over_postgresql(tmp_path: Path, postgresql_url: str) -> None:
    """The async setting served by two relay processes (the second a replica): the crowd's results reach both, the
    first merges them, nothing is refused but what any crowd meets."""
    out = tmp_path / "crowd.json"
    command = [sys.executable, "-m", "server.cli", "bench", "crowd", "--peers", "12", "--ks", "5", "--async-k", "4",
               "--async-merges", "3", "--async-seconds", "300", "--rounds", "1", "--addresses", "4", "--skip-browser",
               "--skip-training", "--liars", "0", "--relays", "2", "--store", postgresql_url, "--floor-seconds", "0",
               "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    figures = {r["setting"]: r for r in json.loads(out.read_text())["results"]}["async K=4, 2 relays"]
    assert not figures["errors"] and figures["rounds"] >= 3 and figures["honest_banned"] == 0, figures
    assert set(figures["refusals"]) <= {"duplicate", "not_leased"}, figures["refusals"]
    assert figures["relay_cpu_seconds"] > 0 and "relays at http://" in done.stdout
    assert figures["floor_per_second"] is None and "floor" not in done.stdout  # (--floor-seconds 0)
