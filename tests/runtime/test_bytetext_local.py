"""``bytetext-local``: bytetext's model on a peer's own text files. Bad files are refused with the file and line;
the held-out share is whole 1 kB blocks drawn with a fixed seed; a unit counts the bytes it trains on, at most
the cap; the host validates only on text of its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.tasks import load_task
from runtime.tasks.bytetext_local import BLOCK_BYTES, ByteTextLocalTask
from runtime.tasks.loader import check_task_data, dry_run
from runtime.tasks.local import LocalData, LocalDataError, train_local_unit

TINY = {"n_layer": 1, "n_embd": 16, "n_head": 2, "context": 16, "steps": 2, "batch_size": 4, "units": 2}
TEXT = ("A line of someone's own notes, which never leaves their browser.\n" * 80).encode()


@pytest.fixture(scope="module")
def task() -> ByteTextLocalTask:
    found = load_task("bytetext-local", TINY)
    assert isinstance(found, ByteTextLocalTask)
    return found


def test_text_files_are_read_and_bad_ones_named_with_the_line(task: ByteTextLocalTask) -> None:
    assert bytes(task.parse_local("notes.txt", b"\xef\xbb\xbfhello")) == b"hello\n\n"
    with pytest.raises(LocalDataError, match=r"^latin\.txt, line 2: not UTF-8 text \(byte 0xe9"):
        task.parse_local("latin.txt", "one\ncaf\u00e9\n".encode("latin-1"))
    with pytest.raises(LocalDataError, match=r"^image\.png, line 3: holds NUL bytes: not a text file$"):
        task.parse_local("image.png", b"a\nb\n\0\0")
    with pytest.raises(LocalDataError, match=r"^empty\.txt: the file is empty$"):
        task.parse_local("empty.txt", b"")


def test_a_seeded_share_of_whole_blocks_is_held_out(task: ByteTextLocalTask) -> None:
    examples = np.frombuffer(TEXT * 4, dtype=np.uint8)  # 20,480 bytes: 20 blocks
    train, held = task.split_local(examples)
    assert len(held) == 2 * BLOCK_BYTES and len(train) + len(held) == len(examples)
    again = task.split_local(examples.copy())
    assert np.array_equal(again[1], held)
    short = np.frombuffer(b"just a few bytes of text", dtype=np.uint8)
    assert task.split_local(short)[1].size == 0  # one block: nothing to hold out, all trains


def test_a_unit_trains_on_at_most_the_cap_and_evaluates_the_held_out_text(task: ByteTextLocalTask) -> None:
    local = LocalData(task)
    local.add("a.txt", TEXT)
    local.add("b.txt", TEXT)
    assert local.summary()["ready"] and local.summary()["held_out"] == BLOCK_BYTES
    weights = task.initial_weights(0)
    result = train_local_unit(task, weights, local.work_unit(0, seed=5))
    assert result.num_examples == local.summary()["train"]
    assert result.metrics["federated_val_loss"] == pytest.approx(np.log(256), rel=0.05)  # untrained: ~uniform
    assert result.metrics["federated_bits_per_byte"] == pytest.approx(8, rel=0.05)
    capped = load_task("bytetext-local", TINY | {"max_bytes_per_unit": 500})
    capped_local = LocalData(capped)
    capped_local.add("a.txt", TEXT)
    assert train_local_unit(capped, weights, capped_local.work_unit(0, seed=5)).num_examples == 500


def test_the_host_validates_only_on_its_own_text(task: ByteTextLocalTask, tmp_path: Path) -> None:
    data = check_task_data(task, task.prepare())
    assert data.validation == {} and dry_run(task, data) == {}
    (tmp_path / "host.txt").write_bytes(TEXT)
    hosted = load_task("bytetext-local", TINY | {"validation_files": [str(tmp_path / "host.txt")]})
    metrics = dry_run(hosted, check_task_data(hosted, hosted.prepare()))
    assert set(metrics) == {"val_loss", "bits_per_byte"}
    assert hosted.samples(hosted.initial_weights(0), {}) != []  # samples need no held-out text
