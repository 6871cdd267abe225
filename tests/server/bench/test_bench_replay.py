"""``peertrain bench replay``: its deviation maths by hand, and a quick run in headless Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from server.bench.replay import UnitDeviation, compare, nice_ceiling, recommend, summarize, table
from server.relay.verify import DEFAULT_VERIFY_RTOL

REPO_ROOT = Path(__file__).resolve().parents[3]
COLUMNS = ["task", "device", "units", "rounds", "median relative", "p99 relative", "max relative", "max absolute",
           "bit-identical", "trajectories differ", "refused at rtol 1e-2", "browser s/unit", "replay s/unit",
           "time (s)"]


def row(relative: float, absolute: float = 1.0, *, examples: tuple[int, int] = (10, 10),
        returns: tuple[float, float] | None = None, round_index: int = 0) -> UnitDeviation:
    metrics = [{} if returns is None else {"mean_return": r} for r in returns or (0.0, 0.0)]
    return UnitDeviation(task="t", device="cpu", round=round_index, slot=0, unit_index=0, unit_seed=1,
                         relative=relative, absolute=absolute, update_norm=1.0, identical=relative == 0,
                         accepted=relative <= DEFAULT_VERIFY_RTOL, examples_browser=examples[0],
                         examples_native=examples[1], metrics_browser=metrics[0], metrics_native=metrics[1],
                         browser_seconds=2.0, native_seconds=1.0)


def test_compare_by_hand() -> None:
    global_weights = np.array([1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    native = global_weights + np.array([3.0, 4.0, 0.0, 0.0], dtype=np.float32)  # |native - global| = 5
    browser = native + np.array([0.0, 0.0, 0.03, 0.04], dtype=np.float32)  # |browser - native| = 0.05
    relative, absolute, scale, accepted = compare(browser, native, global_weights, rtol=0.011, atol=0.0)
    assert scale == pytest.approx(5.0) and absolute == pytest.approx(0.05, rel=1e-5)
    assert relative == pytest.approx(0.01, rel=1e-5) and accepted  # 0.05 <= 0.011 * 5
    assert not compare(browser, native, global_weights, rtol=0.009, atol=0.0)[3]  # 0.05 > 0.045
    assert compare(browser, native, global_weights, rtol=0.009, atol=0.006)[3]  # 0.05 <= 0.045 + 0.006
    # bit-identical: no deviation at all; a zero update: 0 if the browser agrees, else infinitely relative
    assert compare(native, native, global_weights)[:2] == (0.0, 0.0)
    assert compare(global_weights, global_weights, global_weights)[0] == 0.0
    assert compare(browser, global_weights, global_weights)[0] == float("inf")


def test_summary_statistics_by_hand() -> None:
    rows = [row(value, absolute=value * 3, round_index=i % 2) for i, value in enumerate([1e-5, 2e-5, 3e-5, 4e-5])]
    summary = summarize(rows)
    assert summary["units"] == 4 and summary["rounds"] == 2
    assert summary["median_relative"] == pytest.approx(2.5e-5)
    assert summary["p99_relative"] == pytest.approx(3e-5 + 0.97 * 1e-5)  # linear between the 3rd and 4th
    assert summary["max_relative"] == 4e-5 and summary["max_absolute"] == pytest.approx(1.2e-4)
    assert summary["trajectories_differ"] == 0 and summary["refused_at_default"] == 0
    assert summary["browser_seconds_per_unit"] == 2.0 and summary["native_seconds_per_unit"] == 1.0


def test_forked_episodes_are_counted_apart() -> None:
    rows = [row(1e-6, returns=(20.0, 20.0)), row(0.3, examples=(150, 151), returns=(18.75, 18.875)),
            row(0.2, returns=(20.0, 21.0)), row(2e-6)]
    assert [r.trajectory_differs for r in rows] == [False, True, True, False]
    summary = summarize(rows)
    assert summary["trajectories_differ"] == 2 and summary["refused_at_default"] == 2
    assert summary["max_relative_forked"] == 0.3 and summary["max_relative_unforked"] == 2e-6


def test_recommended_rtol_rounds_up_a_margin_above_the_largest() -> None:
    assert [nice_ceiling(v) for v in (1e-3, 1.01e-3, 2e-3, 2.5e-3, 4.8e-3, 5e-3, 7e-4)] == [
        1e-3, 2e-3, 2e-3, 5e-3, 5e-3, 5e-3, 1e-3]
    assert recommend(4.8e-4, 10) == 5e-3 and recommend(1.2e-4, 10) == 2e-3 and recommend(0.0) == 1e-6


def test_table_has_one_row_per_run() -> None:
    summary = {"task": "arith", "device": "cpu", "requested": 2, "chosen": "cpu", "skipped": "", "seconds": 3.0}
    empty = summary | {"device": "webgpu", "skipped": "webgpu unavailable"} | summarize([])
    rows = table_rows(table([summary | summarize([row(1e-5), row(3e-5)]), empty]))
    assert rows[0] == COLUMNS and len(rows) == 4 and all(len(r) == len(COLUMNS) for r in rows)
    assert rows[2][:3] == ["arith", "cpu", "2"] and rows[2][6] == "3.00e-05" and rows[3][:3] == ["arith", "webgpu", "0"]


def table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]


@pytest.mark.browser
@pytest.mark.slow
def test_quick_bench_replays_browser_units_within_the_default_tolerance(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    command = [sys.executable, "-m", "server.cli", "bench", "replay", "--quick", "--out", str(out),
               "--work-dir", str(tmp_path / "work")]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = table_rows(result["table"])
    assert result["table"] in done.stdout and rows[0] == COLUMNS and len(rows) == 3
    assert rows[2][:3] == ["arith", "cpu", "3"]
    assert "units trained" in done.stdout and "recommended default rtol" in done.stdout
    units = result["units"]
    assert len(units) == 3 and all(u["task"] == "arith" and u["device"] == "cpu" for u in units)
    # an honest browser result is never refused at the relay's default tolerance
    assert all(0 <= u["relative"] < DEFAULT_VERIFY_RTOL and u["accepted"] for u in units), units
    assert all(u["update_norm"] > 0 and not u["trajectory_differs"] for u in units)
    summary = result["summaries"][0]
    assert summary["units"] == 3 and summary["max_relative"] == max(u["relative"] for u in units)
    assert result["recommendation"]["recommended_rtol"] >= 10 * summary["max_relative"]
