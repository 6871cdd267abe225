"""``peertrain bench privacy``: registered with its options; a small run writes each setting's figures, the noise
multiplier dp-accounting calibrated for each target and the accountant's epsilon after every round."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from server.bench import run_bench, summary
from server.session import accountant


def test_privacy_is_a_registered_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert re.search(r"^\s+privacy\s+built$", summary(), flags=re.M), summary()
    with pytest.raises(SystemExit) as exited:
        run_bench("privacy", ["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert all(option in shown for option in ("--tasks", "--epsilons", "--delta", "--peers", "--rounds", "--seeds",
                                              "--out"))


def test_a_small_run_reaches_each_target_epsilon_after_its_last_round(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "privacy.json"
    assert run_bench("privacy", ["--tasks", "csv", "--epsilons", "2,6", "--peers", "6", "--rounds", "3",
                                 "--seeds", "2", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    rows = figures["tasks"]["csv"]
    assert [row["target"] for row in rows] == [None, 2.0, 6.0]
    assert rows[0]["noise_multiplier"] is None and rows[0]["epsilons"] == [None, None, None]
    for row in rows[1:]:
        assert len(row["finals"]) == 2 and row["metric"] == "val_loss"
        assert row["epsilons"] == pytest.approx([accountant.epsilon(row["noise_multiplier"], n, 1e-6)
                                                 for n in (1, 2, 3)])
        assert row["epsilons"][-1] == pytest.approx(row["target"], abs=0.01)
    assert rows[1]["noise_multiplier"] > rows[2]["noise_multiplier"]
    printed = capsys.readouterr().out
    assert "| no DP (anchor) |" in printed and "| epsilon 2 |" in printed and "against no DP" in printed
