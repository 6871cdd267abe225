"""``peertrain bench demo``: the Makefile's session read, the simulator's seconds and the one-digit sums parsed and
counted, the recorded run's sentence quoted where a reader finds it, and (slow) a short demo in one browser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from relay_fixtures import REPO_ROOT

from runtime.tasks.arith import ArithTask
from server.bench import demo

RECORD = REPO_ROOT / "docs" / "benchmarks" / "demo.json"
SMALL = {"num_examples": 400, "chunks": 4, "validation_size": 40, "generalization_size": 20, "beyond_range_size": 5}


def test_the_session_is_the_makefiles_demo_session(tmp_path: Path) -> None:
    session = demo.demo_session()
    assert session[:2] == ["--task", "arith"] and "--passes" in session
    makefile = tmp_path / "Makefile"
    makefile.write_text("PORT ?= 8000\nDEMO_SESSION := --task arith --set 'lr=0.1' -k 2\ndemo: setup\n")
    assert demo.demo_session(makefile) == ["--task", "arith", "--set", "lr=0.1", "-k", "2"]
    makefile.write_text("demo:\n\tserve\n")
    with pytest.raises(ValueError, match="no DEMO_SESSION"):
        demo.demo_session(makefile)


def test_the_simulators_seconds_are_the_ones_it_prints() -> None:
    output = ("package /x: task arith, 8 units\n| merge | rounds |\n"
              "1 session(s) in 17.7 s in-process; plot /x/comparison.png; histories /x/*/history.jsonl\n")
    assert demo.simulated_seconds(output) == 17.7
    with pytest.raises(ValueError, match="no 'N session"):
        demo.simulated_seconds("peertrain simulate: refused\n")


def test_every_one_digit_sum_is_asked_and_the_wrong_ones_named() -> None:
    task = ArithTask(SMALL)
    data = task.prepare()
    task.attach(data.assets)
    answered = demo.one_digit_sums(task, task.initial_weights(0))
    assert [text.partition("=")[0] for text in answered] == [f"{a}+{b}" for a in range(10) for b in range(10)]
    assert demo.wrong_sums(["3+4=7", "9+9=18", "0+0=1", "2+5="]) == ["0+0=1", "2+5="]

    metrics = {"val_loss": 0.5, "accuracy": 0.975, "correct": 39.0, "heldout_accuracy": 0.9,
               "beyond_range_accuracy": 0.2, "generalization_accuracy": 0.76}
    figures = demo.figures(metrics, data.validation, ["1+1=2", "1+2=4"], seconds=12.34, rounds=3)
    assert figures["seconds"] == 12.3 and figures["correct"] == 39 and figures["validation_size"] == 40
    assert (figures["heldout_correct"], figures["heldout_size"]) == (18, 20)
    assert (figures["beyond_range_correct"], figures["beyond_range_size"]) == (1, 5)
    assert (figures["one_digit_correct"], figures["one_digit_wrong"]) == (1, ["1+2=4"])
    assert int(np.sum(data.validation["gen_beyond"])) == 5


def test_the_sentence_says_both_runs() -> None:
    figure = {"seconds": 95.4, "accuracy": 0.99, "correct": 198, "validation_size": 200, "heldout_correct": 194,
              "heldout_size": 200, "beyond_range_correct": 0, "beyond_range_size": 50, "one_digit_correct": 100,
              "one_digit_size": 100}
    record = {"date": "2026-12-04", "machine": {"cores": 2, "cpu": "AMD EPYC", "ram_gib": 23.5},
              "command": "make demo PEERS=3", "browsers": figure, "simulator": {**figure, "seconds": 22.0},
              "ratio": 4.34}
    assert demo.summary_sentence(record) == (
        "On 2026-12-04, on 2 cores (AMD EPYC, 23.5 GiB), `make demo PEERS=3` took 95 s from the first unit handed "
        "out to the end and reached 99.0 % exact answers (198/200), 194/200 on held-out pairs, 0/50 beyond the "
        "range and 100 of 100 one-digit sums; the same session in the simulator took 22 s (the browsers 4.3 times "
        "as long) and reached 99.0 % exact answers (198/200), 194/200 on held-out pairs, 0/50 beyond the range "
        "and 100 of 100 one-digit sums.")


@pytest.mark.parametrize("page", ["BENCHMARKS.md", "README.md"])
def test_the_recorded_demo_is_quoted_word_for_word(page: str) -> None:
    """docs/benchmarks/demo.json (``bench demo --record``) is the figure; the pages quote its sentence."""
    sentence = demo.summary_sentence(json.loads(RECORD.read_text()))
    assert sentence in (REPO_ROOT / page).read_text(), f"{page} does not quote the recorded demo:\n{sentence}"


@pytest.mark.slow
def test_a_short_demo_in_one_browser_is_timed_and_asked(tmp_path: Path) -> None:
    """One peer, one pass of a small package (3 rounds): 15-30 s with Chromium's start and the simulator's."""
    record = tmp_path / "demo.json"
    small = "--set num_examples=600 --set validation_size=40 --set generalization_size=20 " \
            "--set beyond_range_size=5 --set epochs=1 --passes 1"
    command = [sys.executable, "-m", "server.cli", "bench", "demo", "--peers", "1", "--timeout", "300",
               "--demo-args", small, "--work-dir", str(tmp_path / "work"), "--record", str(record)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    figures = json.loads(record.read_text())
    assert figures["command"].startswith("make demo PEERS=1 DEMO_ARGS=") and figures["peers"] == 1
    for run in ("browsers", "simulator"):
        assert figures[run]["rounds"] == 3 and figures[run]["seconds"] > 0, figures[run]
        assert figures[run]["validation_size"] == 40 and figures[run]["one_digit_size"] == 100
    assert "anchor: " in done.stdout and "browsers: round 3 of 3 merged" in done.stdout
    assert demo.summary_sentence(figures) in done.stdout
