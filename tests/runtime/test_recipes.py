"""Local training recipes of the language-model tasks: the optimizer, its learning rate and momentum, the steps,
the batch size and clipping are task settings, and each does what it says (checked on one or two steps)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.tasks import WorkUnit
from runtime.tasks.arith import ArithTask
from runtime.tasks.bytetext import ByteTextTask

CHUNK = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 40, dtype=np.uint8).astype(np.int32)


def update(steps: int = 1, **recipe: object) -> tuple[np.ndarray, dict]:
    """A bytetext unit's change of the weights under ``recipe`` (batch of 2 windows)."""
    task = ByteTextTask({"steps": steps, "batch_size": 2, **recipe})
    weights = task.flat_weights(task.build_model(0))
    result = task.train_unit(weights, WorkUnit(index=0, seed=5, data=CHUNK))
    return result.weights.astype(np.float64) - weights, result.metrics


def test_one_sgd_step_is_linear_in_the_learning_rate() -> None:
    # Without clipping, one SGD step is -lr * gradient: twice the rate, twice the change, same direction.
    small, _ = update(optimizer="sgd", lr=0.1, clip=0)
    large, _ = update(optimizer="sgd", lr=0.2, clip=0)
    assert np.abs(small).max() > 0
    np.testing.assert_allclose(large, 2 * small, rtol=1e-3, atol=5e-7)  # (weights are float32: ulps near 1e-7)


def test_momentum_changes_only_the_second_step() -> None:
    # Heavy ball: v1 = g1, so step 1 is plain SGD's; v2 = momentum * g1 + g2 differs from g2.
    plain1, _ = update(optimizer="sgd", lr=0.1, clip=0)
    heavy1, _ = update(optimizer="sgd", lr=0.1, momentum=0.9, clip=0)
    assert plain1.tobytes() == heavy1.tobytes()
    plain2, _ = update(2, optimizer="sgd", lr=0.1, clip=0)
    heavy2, _ = update(2, optimizer="sgd", lr=0.1, momentum=0.9, clip=0)
    assert np.linalg.norm(heavy2 - plain2) > 0.1 * np.linalg.norm(plain2 - plain1)


def test_adam_steps_by_the_sign_of_the_gradient_sgd_follows() -> None:
    # Adam's first step is lr * g / (|g| + eps): about lr on every coordinate with a real gradient, in the
    # direction of SGD's step on the same batch (the same gradient).
    sgd, _ = update(optimizer="sgd", lr=1.0, clip=0)
    adam, _ = update(optimizer="adam", lr=1e-3, clip=0)
    strong = np.abs(sgd) > 1e-4
    assert strong.sum() > 1000
    assert (np.sign(adam[strong]) == np.sign(sgd[strong])).all()
    np.testing.assert_allclose(np.abs(adam[strong]), 1e-3, rtol=0.05)


def test_clipping_bounds_the_sgd_step() -> None:
    free, _ = update(optimizer="sgd", lr=1.0, clip=0)
    clipped, _ = update(optimizer="sgd", lr=1.0, clip=0.01)
    # one step: the change is lr * the clipped gradient, whose norm is at most 0.01 (gradients here are larger)
    assert np.linalg.norm(free) > 0.02
    assert np.linalg.norm(clipped) == pytest.approx(0.01, rel=1e-3)
    np.testing.assert_allclose(clipped / np.linalg.norm(clipped), free / np.linalg.norm(free), atol=1e-5)


def test_steps_and_batch_size_are_the_recipe() -> None:
    _, metrics = update(3, optimizer="sgd", lr=0.1)
    assert metrics["steps"] == 3


@pytest.mark.parametrize("task", [ByteTextTask, ArithTask])
@pytest.mark.parametrize("recipe, message", [
    ({"optimizer": "lion"}, "optimizer must be one of adam, sgd, got 'lion'"),
    ({"optimizer": "sgd", "momentum": 1.0}, "momentum must be in \\[0, 1\\)"),
    ({"optimizer": "adam", "momentum": 0.9}, "momentum is an SGD setting"),
    ({"clip": -1.0}, "clip must be >= 0"),
])
def test_a_recipe_the_task_cannot_run_is_refused(task: type, recipe: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        task(recipe)


def test_the_report_half_is_held_out_from_the_selection_metric() -> None:
    task = ByteTextTask({"validation_windows": 8})
    halves = ByteTextTask({"validation_windows": 8, "report_half": True})
    data = task.prepare()
    weights = task.flat_weights(task.build_model(0))
    whole, split = task.validate(weights, data.validation), halves.validate(weights, data.validation)
    assert "report_loss" not in whole and split["val_loss"] != whole["val_loss"]
    # every window counts the same number of targets, so the whole split's loss is the mean of the halves'
    assert (split["val_loss"] + split["report_loss"]) / 2 == pytest.approx(whole["val_loss"], rel=1e-6)
