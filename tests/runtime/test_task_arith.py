"""The arithmetic task: chunk layout, settings errors, replay, tokenizer assets, and the BPE pitfall.

The char tokenizer must learn sums; a BPE trained on the problems (glued "7+4", "8=8" fragments) must not; the
demo session (the Makefile's DEMO_SESSION) must get every one-digit sum right.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from runtime.data.arith import IGNORE_INDEX
from runtime.data.tokenizer import EOS
from runtime.tasks import HostServices, TaskError, load_task
from runtime.tasks.arith import ArithTask
from runtime.tasks.base import WorkUnit
from runtime.tasks.loader import dry_run
from server import cli
from server.bench.demo import demo_session, one_digit_sums, wrong_sums
from server.session import checkpoint_files
from server.session.package import Package

SMALL = {"num_examples": 400, "chunks": 4, "validation_size": 40, "generalization_size": 20, "beyond_range_size": 5}


def train(task: ArithTask, data, epochs: int, seed: int = 0) -> np.ndarray:
    """Every chunk, one unit after the other, ``epochs`` times (FedAvg with one participant per round)."""
    weights = task.initial_weights(seed)
    for epoch in range(epochs):
        for index, chunk in enumerate(data.units):
            unit = WorkUnit(index=index, seed=epoch * data.num_units + index, data=chunk)
            weights = task.train_unit(weights, unit).weights
    return weights


@pytest.fixture(scope="module")
def small() -> tuple[ArithTask, object]:
    task = ArithTask(SMALL)
    data = task.prepare()
    task.attach(data.assets)
    return task, data


def test_chunks_hold_inputs_and_answer_only_targets(small) -> None:
    task, data = small
    assert data.num_units == 4 and len(data.units) == 4
    assert sum(chunk.shape[1] for chunk in data.units) == 400
    tok = task.tokenizer
    for chunk in data.units:
        assert chunk.dtype == np.int32 and chunk.ndim == 3 and chunk.shape[0] == 2
        inputs, targets = chunk
        assert inputs.shape == targets.shape and inputs.shape[1] == 9  # "99+99=198<eos>" minus one
        counted = targets != IGNORE_INDEX
        # targets are the next input token wherever counted, and every row ends with <eos>
        inner = counted[:, :-1] & (targets[:, :-1] != tok.eos_id)
        assert np.array_equal(targets[:, :-1][inner], inputs[:, 1:][inner])
        assert (targets == tok.eos_id).sum(axis=1).tolist() == [1] * len(targets)
    row = tok.decode(data.units[0][0][0]).replace("<pad>", "")
    prompt = row.split("=")[0] + "="
    first_counted = int(np.argmax(data.units[0][1][0] != IGNORE_INDEX))
    assert first_counted == len(prompt) - 1  # the loss starts at the answer's first digit
    assert set(data.validation) >= {"loss_inputs", "loss_targets", "val_prompts", "val_answers", "gen_beyond"}
    assert len(data.validation["val_answers"]) == 40 and int(data.validation["gen_beyond"].sum()) == 5


def test_dry_run_and_metrics(small) -> None:
    task, data = small
    metrics = dry_run(task, data, seed=0)
    assert set(metrics) >= {"val_loss", "accuracy", "generalization_accuracy", "beyond_range_accuracy"}
    assert metrics["val_loss"] > 1.0 and metrics["accuracy"] <= 0.1
    assert load_task("arith", SMALL).describe()["crosses_boundary"].startswith("Peers receive one chunk")


def test_replaying_a_unit_gives_bit_identical_weights(small) -> None:
    task, data = small
    start = task.initial_weights(3)
    unit = WorkUnit(index=1, seed=77, data=data.units[1])
    first = task.train_unit(start, unit)
    second = task.train_unit(start.copy(), unit)
    assert first.weights.dtype == np.float32 and np.array_equal(first.weights, second.weights)
    assert first.num_examples == data.units[1].shape[1]
    other = task.train_unit(start, WorkUnit(index=1, seed=78, data=data.units[1]))
    assert not np.array_equal(first.weights, other.weights)


def test_samples_show_one_digit_two_digit_and_held_out_problems(small) -> None:
    """The page's samples: a one-digit pair, a two-digit pair and a held-out pair in turn (not 1+1, 1+2, ...)."""
    task, data = small
    samples = task.samples(task.initial_weights(0), data.validation)
    assert len(samples) == 6 and all(s.ok is False and " wrong, want " in s.text for s in samples)
    prompts = [s.text.removeprefix("never trained on: ").split("=")[0] for s in samples]
    operands = [tuple(int(x) for x in prompt.split("+")) for prompt in prompts]
    assert all(max(pair) < 10 for pair in operands[0::3]) and all(min(pair) >= 10 for pair in operands[1::3])
    assert [s.text.startswith("never trained on: ") for s in samples] == [False, False, True] * 2
    older = {k: v for k, v in data.validation.items() if k != "sample_heldout"}  # a package built before the mark
    assert [s.text for s in task.samples(task.initial_weights(0), older)] == [
        s.text.removeprefix("never trained on: ") for s in samples]


def test_tokenizer_travels_as_an_asset(small) -> None:
    task, data = small
    peer = ArithTask(SMALL)
    peer.attach(data.assets)
    assert peer.tokenizer.vocab == task.tokenizer.vocab and peer.model_config() == task.model_config()
    assert peer.tokenizer.to_json() == data.assets["tokenizer"]
    assert peer.model_config()["vocab_size"] == 2 + 10 + 2  # <pad>, <eos>, digits, '+', '='
    with pytest.raises(TaskError, match="tokenizer"):
        peer.attach({"tokenizer": "{not json"})


@pytest.mark.parametrize(("settings", "named"), [
    ({"tokenizer": "words"}, "tokenizer"),
    ({"chunks": 0}, "chunks"),
    ({"num_examples": 3, "chunks": 5}, "chunks"),
    ({"operators": ["/"]}, "operators"),
    ({"lr": 0}, "lr"),
    ({"batch_size": 0}, "batch_size"),
    ({"n_embd": 30}, "n_embd"),
    ({"n_layer": 0}, "n_layer"),
    ({"model": "huge"}, "model"),
    ({"epoch": 3}, "unknown setting"),
])
def test_bad_settings_name_the_setting(settings: dict, named: str) -> None:
    with pytest.raises(TaskError, match=named):
        ArithTask(settings)


def test_bpe_needs_the_host_and_a_short_context_is_refused() -> None:
    with pytest.raises(TaskError, match="train_bpe"):
        ArithTask({**SMALL, "tokenizer": "bpe"}).prepare(None)
    with pytest.raises(TaskError, match="train_bpe"):
        ArithTask({**SMALL, "tokenizer": "bpe"}).prepare(HostServices())
    with pytest.raises(TaskError, match="context"):
        ArithTask({**SMALL, "context": 6}).prepare()
    with pytest.raises(TaskError, match="2, N, T"):
        task = ArithTask(SMALL)
        task.train_unit(task.initial_weights(0), WorkUnit(index=0, seed=0, data=np.zeros((3, 4), np.int32)))


def test_char_inspection_has_no_warning() -> None:
    lines = ArithTask(SMALL).inspect_lines()
    assert lines[1] == '37+48=85<eos> -> "3" | "7" | "+" | "4" | "8" | "=" | "8" | "5" | "<eos>"'
    assert not any("warning" in line for line in lines)


@pytest.mark.usefixtures("one_blas_thread")
def test_char_tokenizer_learns_sums() -> None:
    """Two-digit operands (10-49, one fixed width) learn to >= 90% exact answers in two passes, on held-out
    pairs too; mixed widths (0-99, the default range) take longer: see the slow test below."""
    task = ArithTask({"operand_min": 10, "operand_max": 49, "num_examples": 3000, "chunks": 1, "lr": 5e-3,
                      "validation_size": 100, "generalization_size": 40, "beyond_range_size": 10})
    data = task.prepare()
    before = task.validate(task.initial_weights(0), data.validation)
    weights = train(task, data, epochs=2)
    after = task.validate(weights, data.validation)
    assert before["accuracy"] <= 0.05 and after["accuracy"] >= 0.9, after
    assert after["heldout_accuracy"] >= 0.85 and after["val_loss"] < before["val_loss"] / 5, after
    samples = task.samples(weights, data.validation)
    assert len(samples) == 6 and sum(s.ok for s in samples) >= 5
    assert all(s.text.endswith(" ok") == s.ok for s in samples)


@pytest.mark.slow
# Two whole sessions of CPU-bound training: 83 s on a quiet machine, 892 s in a fresh-clone suite run while two busy
# loops, a benchmark and browser tests shared the two cores (a hair under the global 900 s).
@pytest.mark.timeout(2700)
@pytest.mark.usefixtures("one_blas_thread")
def test_bpe_pitfall_stays_low_char_reaches_99_percent() -> None:
    """The benchmark's data and model (REPORT_SETTINGS): bpe stays near 0/200 with glued fragments; char reaches
    >= 198/200.

    Char crosses 99% around epoch 18 and then wobbles (188-198/200: every unit restarts Adam at the full
    learning rate), so this asserts that it *reaches* 99% within 24 epochs."""
    pytest.importorskip("tokenizers")
    from server.bench.arith import REPORT_SETTINGS, train_sequentially

    bpe = train_sequentially({**REPORT_SETTINGS, "tokenizer": "bpe"}, epochs=4, log=lambda _: None)
    assert '37+48=85<eos> -> "3" | "7+4" | "8=8" | "5<eos>\\n"' in bpe.inspection
    assert any(line.startswith("tokenizer warning") and EOS in line for line in bpe.inspection)
    assert bpe.final["accuracy"] <= 0.1, bpe.final
    char = train_sequentially({**REPORT_SETTINGS, "tokenizer": "char"}, epochs=24, target=0.99, log=lambda _: None)
    assert char.final["correct"] >= 198, char.epochs
    assert not any("warning" in line for line in char.inspection)


@pytest.mark.slow
# One demo session of CPU-bound training (19 rounds of 3 units): 35-57 s on 2 cores beside other work.
def test_the_demo_session_learns_every_one_digit_sum(tmp_path: Path) -> None:
    """The demo's settings in the simulator: at least 99 % exact answers on the 200 validation problems (drawn
    uniformly from 0-99) and every a+b with a, b in 0..9 right (all 100 of them trained on).

    Measured (7 passes, lr 0.007): 199/200 and 100/100 (seed 0, the demo's); seeds 1-3: 200, 200, 197 with 100,
    100, 99 (so not every draw gets there: the model's jump from ~80 % to ~98 % comes a few rounds earlier or later).
    Uniform operands (width_balance=0) got 194/200 and 41/100 with the earlier 4-pass demo."""
    args = demo_session()
    assert args[:2] == ["--task", "arith"]
    assert cli.main(["simulate", *args, "--workers", "1", "--no-progress", "--out", str(tmp_path)]) == 0
    history = [json.loads(line) for line in (tmp_path / "fedavg" / "history.jsonl").read_text().splitlines()]
    final = history[-1]["metrics"]
    assert final["accuracy"] >= 0.99, [entry["metrics"]["accuracy"] for entry in history]
    task = Package.load(tmp_path / "package").task
    answered = one_digit_sums(task, checkpoint_files.read_latest(tmp_path / "fedavg").weights)
    assert wrong_sums(answered) == []
