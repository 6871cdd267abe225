"""``peertrain simulate`` end to end on a tiny byte-level config, merge choices, and ``peertrain bench`` dispatch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.merge import InvalidHyperparameter, UnknownMerge
from server import bench, cli
from server.simulation.simulator import MergeChoice, parse_merge_choices, with_common_settings

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("Sphinx of black quartz, judge my vow. How vexingly quick daft zebras jump!\n" * 200)
    return path


def tiny_args(text_file: Path, out: Path) -> list[str]:
    return ["simulate", "--task", "bytetext", "--set", f"files=[\"{text_file}\"]", "--set", "chunks=6",
            "--set", "steps=1", "--set", "batch_size=4", "--set", "validation_windows=8",
            "-k", "2", "--passes", "1", "--no-progress", "--out", str(out)]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_simulate_writes_history_plot_and_table(tmp_path: Path, text_file: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(tiny_args(text_file, tmp_path)) == 0
    history = read_jsonl(tmp_path / "fedavg" / "history.jsonl")
    assert [entry["round"] for entry in history] == [0, 1, 2]
    assert all({"val_loss", "bits_per_byte"} <= set(entry["metrics"]) for entry in history)
    assert (tmp_path / "comparison.png").read_bytes()[:8] == PNG_MAGIC
    out = capsys.readouterr().out
    assert "| fedavg | 3 |" in out
    assert (tmp_path / "fedavg" / "latest").is_file() and (tmp_path / "package" / "manifest.json").is_file()
    # bytetext's default codec (--codec auto) is topk: each round's weights moved by a decoded topk step
    assert all(entry["download"]["codec"] == "topk" for entry in history)


@pytest.mark.parametrize("codec", ["none", "topk"])
def test_simulate_takes_the_codec_it_is_given(tmp_path: Path, text_file: Path, codec: str) -> None:
    assert cli.main(tiny_args(text_file, tmp_path) + ["--codec", codec, "--rounds", "1"]) == 0
    history = read_jsonl(tmp_path / "fedavg" / "history.jsonl")
    assert [entry.get("download", {}).get("codec", "none") for entry in history] == [codec]


def test_two_merges_share_one_plot_and_one_table(tmp_path: Path, text_file: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    args = tiny_args(text_file, tmp_path) + ["--merge", "fedavg,fedavgm", "--server-momentum", "0.5", "--rounds", "2"]
    assert cli.main(args) == 0
    table = (tmp_path / "comparison.md").read_text()
    assert "| fedavg | 2 |" in table and "| fedavgm m=0.5 | 2 |" in table
    assert table.strip() in capsys.readouterr().out
    assert list(tmp_path.glob("*.png")) == [tmp_path / "comparison.png"]
    plain, momentum = (read_jsonl(tmp_path / name / "history.jsonl") for name in ("fedavg", "fedavgm-m0.5"))
    assert len(plain) == len(momentum) == 2
    assert [e["units"] for e in plain] == [e["units"] for e in momentum]  # same chunk order
    # Round 1 of FedAvgM is FedAvg's step (momentum starts at zero): same initial weights, same result.
    assert plain[0]["metrics"] == momentum[0]["metrics"]
    assert plain[1]["metrics"] != momentum[1]["metrics"]


def test_simulate_refuses_guarded_merge_with_the_reason(tmp_path: Path, text_file: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    args = tiny_args(text_file, tmp_path) + ["-k", "3", "--merge", "fedavg,fedadam"]
    assert cli.main(args) == 2
    error = capsys.readouterr().err
    assert "refusing merge method 'fedadam'" in error and "--force" in error
    assert not (tmp_path / "fedavg").exists()  # refused before anything trained


def test_merge_choices_parse_and_fill_in_common_settings() -> None:
    choices = parse_merge_choices(["fedavg,fedavgm:server_momentum=0.5,server_learning_rate=0.5", "fedadam"])
    assert choices == [MergeChoice("fedavg"), MergeChoice("fedavgm", {"server_momentum": 0.5,
                                                                      "server_learning_rate": 0.5}),
                       MergeChoice("fedadam")]
    assert choices[1].label == "fedavgm m=0.5 lr=0.5" and choices[1].slug == "fedavgm-m0.5-lr0.5"
    filled = with_common_settings(choices, {"server_momentum": 0.9, "eta": 0.03})
    assert filled[1].config["server_momentum"] == 0.5  # a choice's own setting wins
    assert filled[2].config == {"eta": 0.03} and filled[0].config == {}
    assert parse_merge_choices([]) == [MergeChoice("fedavg")]
    with pytest.raises(InvalidHyperparameter, match="no chosen merge method takes eta"):
        with_common_settings([MergeChoice("fedavg")], {"eta": 0.1})
    with pytest.raises(InvalidHyperparameter, match="server_momentum"):
        parse_merge_choices(["fedavgm:server_momentum=1.5"])
    with pytest.raises(UnknownMerge):
        parse_merge_choices(["fedsgd"])


def test_bench_dispatch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(bench.BENCHES, "relay", ("server.bench._not_there",))
    assert cli.main(["bench", "relay"]) == 2
    assert "not built yet" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "merges", "--help"])
    assert "--steps" in capsys.readouterr().out
