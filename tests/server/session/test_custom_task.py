"""Custom task modules: the README's and the docs' examples work end to end; broken modules get errors that name
the problem."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from runtime.merge import Result, make_merge
from runtime.tasks import TaskError, load_task, task_class
from server import cli
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.app import RelayPaths
from server.session.config import SessionConfig
from server.session.package import Package, build_package

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = REPO_ROOT / "examples" / "majority_task.py"
README_EXAMPLE = REPO_ROOT / "examples" / "circle_task.py"


@pytest.mark.parametrize(("document", "example"), [("README.md", README_EXAMPLE), ("docs/tasks/writing.md", EXAMPLE)])
def test_the_documents_show_the_example_files_verbatim(document: str, example: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (REPO_ROOT / document).read_text(), flags=re.S)
    assert example.read_text() in blocks


def test_the_readme_task_is_short_and_learns_in_the_simulator(tmp_path: Path) -> None:
    """The README's task, as its commands run it: `simulate -k 3 --passes 2` ends above 95 % accuracy."""
    assert len(README_EXAMPLE.read_text().splitlines()) <= 50
    out = tmp_path / "out"
    assert cli.main(["simulate", "--task", str(README_EXAMPLE), "-k", "3", "--passes", "2", "--workers", "1",
                     "--no-progress", "--out", str(out)]) == 0
    history = [json.loads(line) for line in next(out.glob("*/history.jsonl")).read_text().splitlines()]
    assert len(history) == 4 and history[-1]["metrics"]["accuracy"] > 0.95


def test_example_task_packages_and_learns(tmp_path: Path) -> None:
    package = build_package(str(EXAMPLE), {"chunks": 4}, tmp_path / "pkg", seed=1, log=lambda _: None)
    assert package.manifest["task_import"] == "peertrain_task_majority_task:MajorityTask"
    assert Package.load(tmp_path / "pkg").fingerprint == package.fingerprint
    task, data = package.task, package.data
    weights = package.initial_weights
    before = task.validate(weights, data.validation)["accuracy"]
    fedavg = make_merge("fedavg")
    for round_index in range(3):
        results = [task.train_unit(weights, task.work_unit(data, (2 * round_index + i) % 4, 10 * round_index + i))
                   for i in range(2)]
        weights = fedavg.merge(weights, [Result(r.weights, r.num_examples) for r in results])
    after = task.validate(weights, data.validation)["accuracy"]
    assert before < 0.7 and after > 0.95
    assert all(s.ok is not None for s in task.samples(weights, data.validation))


def test_dotted_reference_with_class_name() -> None:
    assert task_class("runtime.tasks.bytetext:ByteTextTask").name == "bytetext"


BROKEN_MODULES = {
    "syntax.py": ("def broken(:\n", "failed to import: SyntaxError"),
    "raises.py": ("raise RuntimeError('no data here')\n", "failed to import: RuntimeError: no data here"),
    "empty.py": ("X = 1\n", "defines no subclass of runtime.tasks.Task"),
    "partial.py": ("from runtime.tasks import Task\nclass Half(Task):\n    def crosses_boundary(self):\n"
                   "        return 'nothing'\n", "does not define model_config, build_model, prepare, train_unit"),
    "two.py": ("from runtime.tasks import Task\nclass A(Task):\n    pass\nclass B(Task):\n    pass\n",
               "defines several tasks ['A', 'B']"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_MODULES))
def test_broken_module_is_named(tmp_path: Path, name: str) -> None:
    source, message = BROKEN_MODULES[name]
    path = tmp_path / name
    path.write_text(source)
    with pytest.raises(TaskError, match=re.escape(message)):
        load_task(str(path))


def test_missing_file_and_unknown_class(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="does not exist"):
        load_task(str(tmp_path / "nope.py"))
    with pytest.raises(TaskError, match="no Task subclass named 'Nope'"):
        load_task(f"{EXAMPLE}:Nope")
    with pytest.raises(TaskError, match="failed to import: ModuleNotFoundError"):
        load_task("no_such_package.module")


def test_wrong_shapes_are_caught_before_a_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = EXAMPLE.read_text().replace(
        "return UnitResult(self.flat_weights(model),", "return UnitResult(self.flat_weights(model)[:3],")
    path = tmp_path / "short_weights.py"
    path.write_text(source)
    assert cli.main(["package", "--task", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "train_unit returned weights float32[3], expected float32[" in err
    assert not (tmp_path / "out").exists()


def test_unknown_setting_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["package", "--task", str(EXAMPLE), "--set", "epocs=3", "--out", str(tmp_path / "o")]) == 2
    assert "unknown setting(s) ['epocs']" in capsys.readouterr().err


def test_replaying_a_unit_is_bit_identical() -> None:
    task = load_task(str(EXAMPLE))
    data = task.prepare()
    weights = task.initial_weights(0)
    first = task.train_unit(weights, task.work_unit(data, 2, 99)).weights
    again = task.train_unit(weights, task.work_unit(data, 2, 99)).weights
    other = task.train_unit(weights, task.work_unit(data, 2, 100)).weights
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.slow
@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
def test_a_task_from_a_file_gets_its_own_wheels_and_leaves_the_installs_alone(tmp_path: Path) -> None:
    """Every relay on a machine serves the install's wheels/. A relay whose task is a file builds the task's wheel
    into its session's folder and serves that one: the install's lock file is the same file afterwards (it was
    removed and put back under the pages of every other relay, with this task's lock), a relay of a built-in task
    started beside it serves the install's lock, and the host replays still run on the browser's engine (from the
    task's text: the Node workers load the install's lock)."""
    install_lock = RelayPaths().wheels / "pyodide-lock.json"
    before = (install_lock.read_bytes(), install_lock.stat().st_mtime_ns)
    dist = "peertrain-task-majority-task"
    file_task = ServeCommand(task=str(EXAMPLE), task_settings={"chunks": 4}, session_dir=tmp_path / "file",
                             config=SessionConfig(participants=2, passes=1))
    builtin = ServeCommand(task="arith", session_dir=tmp_path / "builtin", config=SessionConfig(participants=2))
    with RelayProcess(file_task, log=tmp_path / "file.log") as mine, \
            RelayProcess(builtin, log=tmp_path / "builtin.log") as other:
        served = httpx.get(mine.url + "/wheels/pyodide-lock.json", timeout=30).json()["packages"]
        wheel = httpx.get(f"{mine.url}/wheels/{served[dist]['file_name']}", timeout=30)
        other_served = httpx.get(other.url + "/wheels/pyodide-lock.json", timeout=30).content
        logs = mine.logs
    assert wheel.status_code == 200 and wheel.content[:4] == b"PK\x03\x04"
    assert (tmp_path / "file" / "wheels" / served[dist]["file_name"]).is_file()
    assert (install_lock.read_bytes(), install_lock.stat().st_mtime_ns) == before
    assert other_served == before[0]
    assert "replays exactly on the browser's engine" in logs, logs[-2000:]
