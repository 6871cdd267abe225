"""The runtime transformer against PyTorch: logits, loss and every gradient from the same weights and batch.

PyTorch lives in a separate Python 3.11 environment (torch 2.13.0 has no 3.12 CPU wheel here); the oracle script
`torch_oracle.py` runs there and exchanges .npz files with this test.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from runtime.models import Transformer, TransformerConfig, preset

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
ORACLE = Path(__file__).with_name("torch_oracle.py")
TORCH_PYTHON = Path(os.environ.get("PEERTRAIN_TORCH_PYTHON", ROOT / ".venv-torch" / "bin" / "python"))
TOLERANCE = 1e-4


def relative_difference(ours: np.ndarray, reference: np.ndarray) -> float:
    """max |ours - reference| / max |reference|: one number per tensor, meaningful for tiny entries too."""
    return float(np.max(np.abs(ours - reference)) / max(float(np.max(np.abs(reference))), 1e-30))


@pytest.mark.parametrize(
    "config",
    [
        preset("bytelm-2.3mb"),
        TransformerConfig(vocab_size=50, context=16, n_layer=2, n_head=2, n_embd=24, bias=True, tied_head=False),
    ],
    ids=["bytelm-2.3mb", "small-bias-untied"],
)
def test_logits_loss_and_gradients_match_torch(config: TransformerConfig, tmp_path: Path) -> None:
    if not TORCH_PYTHON.exists():
        pytest.skip(
            f"no PyTorch Python at {TORCH_PYTHON}; create it with `/root/.pyenv/versions/3.11.7/bin/python -m venv "
            f"{ROOT / '.venv-torch'} && {ROOT / '.venv-torch/bin/pip'} install torch==2.13.0 numpy` "
            "or point PEERTRAIN_TORCH_PYTHON at a Python that has torch"
        )
    model = Transformer(config, seed=11)
    rng = np.random.default_rng(12)
    tokens = rng.integers(0, config.vocab_size, size=(4, config.context + 1))
    idx, targets = tokens[:, :-1], tokens[:, 1:].copy()
    targets[0, :5] = -100  # masked prompt positions
    logits, loss = model(idx, targets)
    assert loss is not None
    loss.backward()

    inputs, outputs = tmp_path / "runtime.npz", tmp_path / "torch.npz"
    weights = {f"param.{name}": p.numpy() for name, p in model.named_parameters()}
    np.savez(inputs, config=np.array(config.to_json()), idx=idx, targets=targets, **weights)
    run = subprocess.run(
        [str(TORCH_PYTHON), str(ORACLE), str(inputs), str(outputs)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    reference = np.load(outputs)

    assert relative_difference(logits.numpy(), reference["logits"]) < TOLERANCE
    assert loss.item() == pytest.approx(float(reference["loss"]), rel=TOLERANCE)
    differences = {
        name: relative_difference(np.asarray(p.grad), reference[f"grad.{name}"]) for name, p in model.named_parameters()
    }
    assert max(differences.values()) < TOLERANCE, differences
