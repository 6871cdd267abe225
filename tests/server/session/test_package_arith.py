"""Packaging the arithmetic task: round trip through the folder, BPE through host services, ``--inspect``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from runtime.data.tokenizer import Tokenizer  # noqa: E402
from runtime.tasks.base import WorkUnit  # noqa: E402
from server import cli  # noqa: E402
from server.session.bpe import (  # noqa: E402
    REPORT_ARITH_SEED,
    REPORT_NUM_EXAMPLES,
    REPORT_NUM_MERGES,
    REPORT_WIDTH_BALANCE,
    train_for_task,
)
from server.session.package import Package, build_package  # noqa: E402

SMALL = {"num_examples": 400, "chunks": 4, "validation_size": 40, "generalization_size": 20, "beyond_range_size": 5}
REPORT = [f"seed={REPORT_ARITH_SEED}", f"num_examples={REPORT_NUM_EXAMPLES}", f"width_balance={REPORT_WIDTH_BALANCE}",
          f"merges={REPORT_NUM_MERGES}"]


def quiet(*_: object) -> None:
    pass


def test_char_package_round_trip(tmp_path: Path) -> None:
    built = build_package("arith", SMALL, tmp_path / "pkg", log=quiet)
    loaded = Package.load(tmp_path / "pkg")
    assert loaded.fingerprint == built.fingerprint
    again = build_package("arith", SMALL, tmp_path / "again", log=quiet)
    assert again.fingerprint == built.fingerprint  # same settings, same data, same fingerprint
    other = build_package("arith", {**SMALL, "seed": 1}, tmp_path / "other", log=quiet)
    assert other.fingerprint != built.fingerprint
    assert loaded.task.tokenizer.vocab == built.task.tokenizer.vocab
    assert loaded.manifest["model_config"]["vocab_size"] == loaded.task.tokenizer.vocab_size == 14
    assert len(loaded.data.units) == 4 and all(c.shape[0] == 2 and c.dtype == np.int32 for c in loaded.data.units)
    for chunk, same in zip(built.data.units, loaded.data.units, strict=True):
        assert np.array_equal(chunk, same)
    assert np.array_equal(loaded.initial_weights, built.initial_weights)
    metrics = loaded.task.validate(loaded.initial_weights, loaded.data.validation)
    assert metrics["val_loss"] > 1.0


def test_bpe_package_through_host_services(tmp_path: Path) -> None:
    settings = {**SMALL, "tokenizer": "bpe", "merges": 40}
    built = build_package("arith", settings, tmp_path / "bpe", log=quiet)
    loaded = Package.load(tmp_path / "bpe")
    tok = loaded.task.tokenizer
    assert len(tok.merges) == 40 and tok.vocab == built.task.tokenizer.vocab
    assert not tok.split_special_tokens and tok.end_text == "<eos>\n"  # the pitfall's glued end marker
    result = loaded.task.train_unit(loaded.initial_weights, WorkUnit(index=0, seed=1, data=loaded.data.units[0]))
    assert result.weights.shape == loaded.initial_weights.shape


def test_train_for_task_takes_problems_or_lines() -> None:
    from runtime.data.arith import ArithSettings, generate_problems

    problems = generate_problems(ArithSettings(num_examples=300, seed=2))
    from_problems = train_for_task(problems, 30)
    from_lines = train_for_task([p.text("<eos>\n") for p in problems], 30)
    assert isinstance(from_problems, Tokenizer) and from_problems.vocab == from_lines.vocab
    clean = train_for_task(problems, 30, glue_end_marker=False)
    assert clean.split_special_tokens and clean.pieces("1+2=3<eos>")[-1] == "<eos>"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_inspect_shows_the_glued_cut_and_warns_for_bpe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sets = [arg for value in [*REPORT, "tokenizer=bpe"] for arg in ("--set", value)]
    out = run_cli(capsys, "package", "--task", "arith", *sets, "--out", str(tmp_path / "bpe"), "--inspect")
    assert '37+48=85<eos> -> "3" | "7+4" | "8=8" | "5<eos>\\n"' in out
    assert "tokenizer warning" in out and '"7+4"' in out


def test_inspect_for_char_has_no_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sets = [arg for value in REPORT for arg in ("--set", value)]
    out = run_cli(capsys, "package", "--task", "arith", *sets, "--out", str(tmp_path / "char"), "--inspect")
    assert '37+48=85<eos> -> "3" | "7" | "+" | "4" | "8" | "=" | "8" | "5" | "<eos>"' in out
    assert "warning" not in out


def test_bad_setting_is_reported_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["package", "--task", "arith", "--set", "tokenizer=words", "--out", str(tmp_path / "x")]) == 2
    assert "tokenizer" in capsys.readouterr().err
