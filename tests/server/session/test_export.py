"""Models that leave in standard formats: named-tensor checkpoints (bit-exact resume, old flat ones still load),
`peertrain export` round trips, and a Hugging Face GPT-2 export that transformers loads and that answers as the
runtime does (logits within 1e-4 on a batch, the same greedy tokens, the same token ids)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from runtime.models import Transformer, TransformerConfig
from runtime.weights import unflatten
from server.cli import main
from server.session import checkpoint_files as checkpoint
from server.session.export import exported_weights, flat_vector, named_tensors
from server.session.package import Package, build_package
from server.session.session import Session, SessionConfig

ROOT = Path(__file__).resolve().parents[3]
TORCH_PYTHON = Path(os.environ.get("PEERTRAIN_TORCH_PYTHON", ROOT / ".venv-torch" / "bin" / "python"))
ORACLE = Path(__file__).resolve().parents[1] / "hf_oracle.py"
ARITH = {"tokenizer": "char", "num_examples": 400, "chunks": 4, "n_layer": 2, "n_embd": 32, "epochs": 1,
         "validation_size": 20, "generalization_size": 10, "beyond_range_size": 5}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Package, Path]:
    """An arithmetic session folder after two rounds (trained weights, non-zero biases)."""
    base = tmp_path_factory.mktemp("export")
    package = build_package("arith", ARITH, base / "package", seed=0, log=lambda _: None)
    session = Session.create(package, SessionConfig(participants=2, passes=1), directory=base / "session")
    while not session.done:
        session.complete_round([(a, package.task.train_unit(session.weights, session.work_unit(a)))
                                for a in session.assignments()])
    return package, base / "session"


def test_checkpoints_hold_one_tensor_per_parameter_and_resume_bit_exact(trained: tuple[Package, Path]) -> None:
    package, folder = trained
    latest = checkpoint.latest_folder(folder) / checkpoint.WEIGHTS_FILE
    tensors = load_file(str(latest))
    assert set(tensors) == set(package.spec.names) and "weights" not in tensors
    assert tensors["wte.weight"].shape == dict(package.spec.entries)["wte.weight"]
    restored = Session.restore(folder, package)
    assert np.array_equal(restored.weights, flat_vector(package.spec, tensors))
    assert np.array_equal(named_tensors(package.spec, restored.weights)["ln_f.bias"], tensors["ln_f.bias"])


def test_an_old_flat_checkpoint_still_loads(trained: tuple[Package, Path], tmp_path: Path) -> None:
    package, folder = trained
    point = checkpoint.read_latest(folder)
    old = tmp_path / "old"
    old.mkdir()
    for name in (checkpoint.MERGE_STATE_FILE, checkpoint.STATE_FILE):
        (old / name).write_bytes((checkpoint.latest_folder(folder) / name).read_bytes())
    save_file({"weights": point.weights}, str(old / checkpoint.WEIGHTS_FILE),
              metadata={"spec": json.dumps(package.spec.to_json()), "round": "2", "fingerprint": "x"})
    assert np.array_equal(checkpoint.read_point(old).weights, point.weights)


def test_export_round_trip_as_named_safetensors(trained: tuple[Package, Path], tmp_path: Path) -> None:
    package, folder = trained
    assert main(["export", str(folder), "--out", str(tmp_path / "st")]) == 0
    blob = (tmp_path / "st" / "model.safetensors").read_bytes()
    assert np.array_equal(exported_weights(blob), checkpoint.read_latest(folder).weights)
    with safe_open(str(tmp_path / "st" / "model.safetensors"), framework="np") as handle:
        metadata = handle.metadata()
        assert set(handle.keys()) == set(package.spec.names)
    config = json.loads((tmp_path / "st" / "config.json").read_text())
    assert config["model_config"]["n_layer"] == 2 and config["task"]["task_import"] and config["tokenizer"]["vocab"]
    assert json.loads(metadata["model_config"]) == config["model_config"]
    assert main(["export", str(folder), "--round", "best", "--out", str(tmp_path / "best")]) == 0
    assert np.array_equal(exported_weights((tmp_path / "best" / "model.safetensors").read_bytes()),
                          checkpoint.read_best(folder).weights)


def test_export_refuses_what_it_cannot_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    assert "holds no session" in capsys.readouterr().err
    assert main(["export", "http://127.0.0.1:9/", "--out", str(tmp_path / "o")]) == 2
    assert "admin token" in capsys.readouterr().err


@pytest.mark.torch
def test_hf_gpt2_export_answers_as_the_runtime_does(trained: tuple[Package, Path], tmp_path: Path) -> None:
    if not TORCH_PYTHON.exists():
        pytest.skip(f"no PyTorch Python at {TORCH_PYTHON} (make torch-env)")
    package, folder = trained
    assert main(["export", str(folder), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert {p.name for p in (tmp_path / "hf").iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    task = package.task
    tokenizer = task.require_tokenizer()
    weights = checkpoint.read_latest(folder).weights
    model = Transformer(TransformerConfig.from_dict(task.model_config()), 0)
    model.load_state_dict(unflatten(weights, package.spec, copy=True))
    prompts = ["37+48=", "1+2=", "9+9="]
    batch = np.array([tokenizer.encode("12+34=46") + [tokenizer.eos_id] * 2, tokenizer.encode("5+5=10") +
                      [tokenizer.eos_id] * 4])
    logits, _ = model.forward(batch)
    new_tokens = 4
    greedy = [model.generate(np.array(tokenizer.encode(p)), new_tokens, stop_token=tokenizer.eos_id).tolist()
              for p in prompts]
    np.savez(tmp_path / "in.npz", batch=batch, prompts=json.dumps(prompts), new_tokens=new_tokens)
    run = subprocess.run([str(TORCH_PYTHON), str(ORACLE), str(tmp_path / "hf"), str(tmp_path / "in.npz"),
                          str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=300)
    if "No module named 'transformers'" in run.stderr:
        pytest.skip("transformers is not installed in the PyTorch environment (make torch-env)")
    assert run.returncode == 0, run.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    theirs = out["logits"]
    assert float(np.max(np.abs(theirs - logits.numpy()))) < 1e-4
    assert json.loads(str(out["encoded"])) == [tokenizer.encode(p) for p in prompts]
    assert json.loads(str(out["decoded"])) == prompts
    hf_greedy = json.loads(str(out["greedy"]))
    for ours, hf in zip(greedy, hf_greedy, strict=True):  # transformers stops at <eos>; ours pads with it
        assert hf == ours[: len(hf)] and all(t == tokenizer.eos_id for t in ours[len(hf):])


def test_the_byte_level_tokenizer_maps_each_byte_to_its_value() -> None:
    """bytetext has no tokenizer: its tokens are the 256 byte values; the exported one must agree."""
    from server.session.export import hf_tokenizer

    tokenizer, eos = hf_tokenizer(None, 256)
    text = "héllo, wörld\n\t~"
    assert tokenizer.encode(text).ids == list(text.encode()) and eos is None
    assert tokenizer.decode(list(text.encode())) == text
