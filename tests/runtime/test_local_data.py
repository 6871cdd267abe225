"""Local tasks: a peer's own files parsed by the task (errors name the file and the line), split into training and a
seeded held-out share, trained with federated evaluation; a task declared local without parse_local is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from runtime import wire
from runtime.peer import Peer
from runtime.protocol import Job
from runtime.tasks import Task, TaskData, TaskError, load_task
from runtime.tasks.loader import check_task_data, dry_run, task_class
from runtime.tasks.local import FEDERATED_EXAMPLES, LocalData, LocalDataError, decode_text, train_local_unit
from runtime.worker import WorkerPeer

REPO_ROOT = Path(__file__).resolve().parents[2]
CSV_TASK = REPO_ROOT / "examples" / "csv_task.py"
PEERS = REPO_ROOT / "examples" / "data" / "csv" / "peers"
GOOD = b"x1,x2,x3,x4,label\n0.1,0.2,0.3,0.4,0\n1,2,3,4,2\n"


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(str(CSV_TASK), {"validation_file": str(REPO_ROOT / "examples/data/csv/validation.csv")})


def refusal(task: Task, name: str, content: bytes) -> str:
    with pytest.raises(LocalDataError) as caught:
        task.parse_local(name, content)
    assert caught.value.file == name
    return str(caught.value)


def test_a_good_file_gives_float_rows_with_the_label_last(task: Task) -> None:
    rows = task.parse_local("good.csv", GOOD)
    assert rows.dtype == np.float32 and rows.shape == (2, 5)
    assert rows[1].tolist() == [1, 2, 3, 4, 2]
    # columns are found by name, in any order, and blank lines are skipped; a byte-order mark is dropped
    shuffled = b"\xef\xbb\xbflabel,x4,x3,x2,x1,extra\n\n1,4,3,2,1,hello\n"
    assert task.parse_local("other.csv", shuffled).tolist() == [[1, 2, 3, 4, 1]]


def test_errors_name_the_file_and_the_line(task: Task) -> None:
    wrong_columns = GOOD + b"5,6,7\n"
    assert refusal(task, "short.csv", wrong_columns) == "short.csv, line 4: 3 columns, the header has 5"
    bad_encoding = GOOD + b"0.5,0.5,0.5,0.5,1\n\xff\xfe,1,1,1,0\n"
    assert refusal(task, "latin.csv", bad_encoding) == \
        "latin.csv, line 5: not UTF-8 text (byte 0xff cannot be decoded)"
    assert refusal(task, "empty.csv", b"") == "empty.csv: the file is empty"
    assert refusal(task, "blank.csv", b"\n \n") == "blank.csv: the file holds only blank space"
    assert refusal(task, "header.csv", b"x1,x2,x3,x4,label\n") == "header.csv, line 1: no data rows after the header"
    assert refusal(task, "nolabel.csv", b"x1,x2,x3,x4\n1,2,3,4\n") == \
        "nolabel.csv, line 1: the header has no column 'label' (it has x1, x2, x3, x4)"
    assert refusal(task, "word.csv", GOOD + b"1,two,3,4,0\n") == "word.csv, line 4: column 'x2': 'two' is not a number"
    assert refusal(task, "class.csv", GOOD + b"1,2,3,4,7\n") == "class.csv, line 4: label '7' is not a class 0-2"
    assert refusal(task, "nan.csv", GOOD + b"1,2,nan,4,1\n") == \
        "nan.csv, line 4: column 'x3': 'nan' is not a finite number"


def test_decode_text_counts_lines_up_to_the_bad_byte() -> None:
    with pytest.raises(LocalDataError, match=r"^notes\.txt, line 3: not UTF-8"):
        decode_text("notes.txt", "one\ntwo\nthr\u00e9e".encode("latin-1"))


def test_local_data_reports_each_file_and_splits_once(task: Task) -> None:
    local = LocalData(task)
    assert not local.summary()["ready"]
    good = local.add("peer/rows.csv", (PEERS / "peer-1" / "rows.csv").read_bytes())
    bad = local.add("peer/broken.csv", GOOD + b"1,2\n")
    assert good.examples == 400 and good.error is None
    assert bad.examples == 0 and bad.error == "peer/broken.csv, line 4: 2 columns, the header has 5"
    summary = local.summary()
    assert summary["ready"] and summary["valid_files"] == 1 and summary["examples"] == 400
    assert (summary["train"], summary["held_out"]) == (320, 80)  # local_holdout = 0.2, seeded
    assert [f["name"] for f in summary["files"]] == ["peer/broken.csv", "peer/rows.csv"]
    train, held = local.split()
    again = LocalData(task)
    again.add("x.csv", (PEERS / "peer-1" / "rows.csv").read_bytes())
    assert np.array_equal(again.split()[1], held)  # the same rows held out, whoever reads the same file
    rows = {tuple(r) for r in train}
    assert not any(tuple(r) in rows for r in held)
    # the same name again replaces the file; the refused one no longer counts
    local.add("peer/broken.csv", GOOD)
    assert local.summary()["examples"] == 402
    local.clear()
    assert local.summary() == {"files": [], "valid_files": 0, "examples": 0, "train": 0, "held_out": 0,
                               "needed": 1, "ready": False}


def test_a_local_unit_reports_federated_metrics_of_the_weights_it_started_from(task: Task) -> None:
    local = LocalData(task)
    local.add("rows.csv", (PEERS / "peer-2" / "rows.csv").read_bytes())
    weights = task.initial_weights(0)
    unit = local.work_unit(3, seed=7)
    result = train_local_unit(task, weights, unit)
    assert result.num_examples == 320 and not np.array_equal(result.weights, weights)
    before = task.evaluate_local(weights, unit.held_out)
    assert result.metrics["federated_accuracy"] == pytest.approx(before["accuracy"])
    assert result.metrics["federated_val_loss"] == pytest.approx(before["val_loss"])
    assert result.metrics[FEDERATED_EXAMPLES] == 80
    again = train_local_unit(task, weights, local.work_unit(3, seed=7))
    assert np.array_equal(again.weights, result.weights)  # a function of (weights, files, seed)


def test_a_unit_never_counts_more_than_the_cap() -> None:
    capped = load_task(str(CSV_TASK), {"max_rows_per_unit": 100})
    local = LocalData(capped)
    local.add("rows.csv", (PEERS / "peer-1" / "rows.csv").read_bytes())
    result = train_local_unit(capped, capped.initial_weights(0), local.work_unit(0, seed=1))
    assert result.num_examples == 100


LOCAL_WITHOUT_PARSER = '''
import numpy as np
from runtime.tasks import Task, TaskData, UnitResult

class Forgetful(Task):
    kind = "local"
    def crosses_boundary(self): return "nothing"
    def model_config(self): return {}
    def build_model(self, seed): raise NotImplementedError
    def prepare(self, host=None): return TaskData(num_units=2)
    def train_unit(self, weights, unit): return UnitResult(weights, 1)
    def validate(self, weights, validation): return {}
'''


def test_a_local_task_without_parse_local_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "forgetful.py"
    path.write_text(LOCAL_WITHOUT_PARSER)
    with pytest.raises(TaskError, match=re.escape("is declared kind = 'local' but does not define "
                                                  "parse_local(name, content)")):
        task_class(str(path))


def test_a_local_task_without_a_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "uncapped.py"
    path.write_text(LOCAL_WITHOUT_PARSER + "    def parse_local(self, name, content): return np.zeros((1, 1))\n")
    task = load_task(str(path))
    with pytest.raises(TaskError, match="must define max_examples_per_unit"):
        check_task_data(task, TaskData(num_units=2))


def test_the_dry_run_trains_the_sample_file_and_validates_on_the_host(task: Task) -> None:
    data = check_task_data(task, task.prepare())
    assert data.units is None and data.validation["rows"].shape == (400, 5)
    assert set(dry_run(task, data)) == {"val_loss", "accuracy"}
    federated_only = load_task(str(CSV_TASK))
    assert dry_run(federated_only, federated_only.prepare()) == {}  # no host split: nothing to validate


def peer_info(task: Task) -> dict:
    return {"task_import": str(CSV_TASK), "settings": task.settings_json(), "spec": task.spec().to_json(),
            "fingerprint": "f" * 16}


def test_the_worker_peer_parses_files_and_trains_local_jobs(task: Task) -> None:
    info = peer_info(task)
    worker = WorkerPeer(json.dumps(info))
    header = wire.WireHeader(spec=task.spec(), round=0, fingerprint=info["fingerprint"], num_examples=0)
    worker.set_weights(wire.encode(task.initial_weights(0), header))
    job = Job(round=0, slot=1, pass_index=0, unit_index=4, unit_seed=99, kind="local", episodes=0, progress=0.0,
              lease_deadline=0.0, lease_seconds=60.0, weights_round=0, num_rounds=1, fingerprint=info["fingerprint"])
    with pytest.raises(TaskError, match="no local data"):
        worker.train(job.dumps())
    report = json.loads(worker.add_local_file("rows.csv", (PEERS / "peer-3" / "rows.csv").read_bytes()))
    assert report == {"name": "rows.csv", "size": report["size"], "examples": 400, "error": None}
    assert json.loads(worker.add_local_file("bad.csv", b""))["error"] == "bad.csv: the file is empty"
    assert json.loads(worker.local_summary())["ready"]
    message, metrics = worker.train(job.dumps())
    decoded, _ = wire.decode(message)
    assert decoded.num_examples == 320 and decoded.metrics[FEDERATED_EXAMPLES] == 80
    assert "federated_accuracy" in json.loads(metrics)
    # the same files and job natively give the same bytes (what the simulator relies on)
    native = Peer(info)
    native.set_weights(wire.encode(task.initial_weights(0), header))
    assert native.local is not None
    native.local.add("rows.csv", (PEERS / "peer-3" / "rows.csv").read_bytes())
    assert wire.decode(native.train(job))[1].tobytes() == wire.decode(message)[1].tobytes()
    worker.clear_local_files()
    assert not json.loads(worker.local_summary())["ready"]


def test_a_data_task_peer_has_no_local_files() -> None:
    task = load_task("runtime.tasks.bytetext:ByteTextTask")
    assert task.describe().get("local") is None
    csv_task = load_task(str(CSV_TASK))
    assert csv_task.describe()["local"] == {"accept": ".csv,text/csv", "hint": csv_task.local_hint,
                                            "max_examples_per_unit": 5000}
