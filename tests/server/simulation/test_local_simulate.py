"""``peertrain simulate --local-data``: a local task's session with each simulated peer training on its own folder,
judged by the host's validation file or by federated evaluation; bad set-ups are refused with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.tasks import TaskError, load_task
from server import cli
from server.session.local_files import folder_files, peer_folders
from server.simulation.local_sim import LocalPeers

REPO_ROOT = Path(__file__).resolve().parents[3]
CSV_TASK = REPO_ROOT / "examples" / "csv_task.py"
DATA = REPO_ROOT / "examples" / "data" / "csv"


def history(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]


def test_simulate_trains_each_peer_on_its_own_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["simulate", "--task", str(CSV_TASK), "--set", f"validation_file={DATA / 'validation.csv'}",
                     "--local-data", str(DATA / "peers"), "-k", "3", "--passes", "2", "--out", str(tmp_path),
                     "--merge", "fedavg,fedavgm", "--force"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "peer 1 (" in out and "1 file(s), 400 examples (320 train, 80 held out)" in out
    for name in ("fedavg", "fedavgm"):
        entries = history(tmp_path / name)
        assert len(entries) == 4 and [e["federated"]["of_round"] for e in entries] == [0, 1, 2, 3]
        assert all(e["examples"] == 3 * 320 and e["federated"]["examples"] == 3 * 80 for e in entries)
    fedavg = history(tmp_path / "fedavg")
    assert fedavg[-1]["metrics"]["accuracy"] > 0.9 > fedavg[0]["federated"]["metrics"]["accuracy"]
    assert (tmp_path / "comparison.png").is_file()


def test_without_host_validation_the_session_is_judged_by_federated_evaluation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    peers = [str(DATA / "peers" / f"peer-{n}") for n in (1, 2)]
    assert cli.main(["simulate", "--task", str(CSV_TASK), "--local-data", peers[0], "--local-data", peers[1],
                     "-k", "2", "--passes", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "judged by federated evaluation" in out
    entries = history(tmp_path / "fedavg")
    assert all(e["metrics"] == {} for e in entries)
    summary = json.loads((tmp_path / "summary.json").read_text())[0]
    assert summary["evaluation"] == "federated"
    losses = [e["federated"]["metrics"]["val_loss"] for e in entries]
    assert summary["best"]["metric"] == pytest.approx(min(losses))


def test_bad_set_ups_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--out", str(tmp_path / "out")]
    assert cli.main([*base, "--task", str(CSV_TASK)]) == 2
    assert "give each simulated peer a folder with --local-data DIR" in capsys.readouterr().err
    assert cli.main([*base, "--task", str(REPO_ROOT / "examples" / "majority_task.py"), "--local-data",
                     str(DATA / "peers")]) == 2
    assert "--local-data is for local tasks; majority is a data task" in capsys.readouterr().err
    forgetful = tmp_path / "forgetful.py"
    forgetful.write_text(CSV_TASK.read_text().replace("def parse_local(", "def parse_local_not(")
                         .replace("self.parse_local(", "self.parse_local_not("))
    assert cli.main([*base, "--task", str(forgetful), "--local-data", str(DATA / "peers")]) == 2
    assert "does not define parse_local(name, content)" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rows.csv").write_text("x1,x2,x3,x4,label\n1,2,3,4,0\n1,2,3\n")
    assert cli.main([*base, "--task", str(CSV_TASK), "--local-data", str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"--local-data {broken}: no usable data for csv (rows.csv, line 3: 3 columns, the header has 5)" in err
    assert cli.main([*base, "--task", str(CSV_TASK), "--local-data", str(tmp_path / "nowhere")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_peer_folders_and_their_files(tmp_path: Path) -> None:
    assert peer_folders([DATA / "peers"]) == [DATA / "peers" / f"peer-{n}" for n in (1, 2, 3)]
    assert peer_folders([DATA / "peers" / "peer-2"]) == [DATA / "peers" / "peer-2"]
    nested = tmp_path / "peer"
    (nested / "sub").mkdir(parents=True)
    (nested / "b.txt").write_text("b")
    (nested / "sub" / "a.txt").write_text("a")
    (nested / ".hidden").write_text("secret")
    assert folder_files(nested) == [("b.txt", b"b"), ("sub/a.txt", b"a")]
    with pytest.raises(TaskError, match="no usable data"):
        LocalPeers.load(load_task(str(CSV_TASK)), [nested])


def test_readme_shows_the_csv_example_file_verbatim() -> None:
    import re

    readme = (REPO_ROOT / "docs" / "tasks" / "local-data.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert CSV_TASK.read_text() in blocks
