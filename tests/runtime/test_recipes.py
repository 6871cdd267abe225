"""Local training recipes of the language-model tasks: the optimizer, its learning rate and momentum, the steps,
the batch size and clipping are task settings of every one (``runtime.tasks.lm_task.LMTask`` owns them), and each
does what it says (checked on one or two steps of bytetext and of bytetext-local)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from runtime.tasks import WorkUnit
from runtime.tasks.arith import ArithTask
from runtime.tasks.bytetext import ByteTextTask
from runtime.tasks.bytetext_local import ByteTextLocalTask
from runtime.tasks.lm_task import ByteLMTask

CHUNK = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 40, dtype=np.uint8).astype(np.int32)


BYTE_TASKS = [ByteTextTask, ByteTextLocalTask]


def trained(task_class: type[ByteLMTask], steps: int, **recipe: object) -> tuple[np.ndarray, np.ndarray, dict]:
    """(initial weights, weights after one unit on CHUNK, its metrics) of a byte task under ``recipe`` (batch of 2
    windows)."""
    task = task_class({"steps": steps, "batch_size": 2, **recipe})
    weights = task.flat_weights(task.build_model(0))
    result = task.train_unit(weights, WorkUnit(index=0, seed=5, data=CHUNK))
    return weights, result.weights, result.metrics


@pytest.fixture(params=BYTE_TASKS, ids=lambda c: c.name)
def update(request: pytest.FixtureRequest) -> Callable[..., tuple[np.ndarray, dict]]:
    """The change of the weights a unit of the byte task makes under a recipe: ``update(steps=1, **recipe)``."""

    def change(steps: int = 1, **recipe: object) -> tuple[np.ndarray, dict]:
        weights, after, metrics = trained(request.param, steps, **recipe)
        return after.astype(np.float64) - weights, metrics

    return change


def test_one_sgd_step_is_linear_in_the_learning_rate(update: Callable[..., tuple[np.ndarray, dict]]) -> None:
    # Without clipping, one SGD step is -lr * gradient: twice the rate, twice the change, same direction.
    small, _ = update(optimizer="sgd", lr=0.1, clip=0)
    large, _ = update(optimizer="sgd", lr=0.2, clip=0)
    assert np.abs(small).max() > 0
    np.testing.assert_allclose(large, 2 * small, rtol=1e-3, atol=5e-7)  # (weights are float32: ulps near 1e-7)


def test_momentum_changes_only_the_second_step(update: Callable[..., tuple[np.ndarray, dict]]) -> None:
    # Heavy ball: v1 = g1, so step 1 is plain SGD's; v2 = momentum * g1 + g2 differs from g2.
    plain1, _ = update(optimizer="sgd", lr=0.1, clip=0)
    heavy1, _ = update(optimizer="sgd", lr=0.1, momentum=0.9, clip=0)
    assert plain1.tobytes() == heavy1.tobytes()
    plain2, _ = update(2, optimizer="sgd", lr=0.1, clip=0)
    heavy2, _ = update(2, optimizer="sgd", lr=0.1, momentum=0.9, clip=0)
    assert np.linalg.norm(heavy2 - plain2) > 0.1 * np.linalg.norm(plain2 - plain1)


def test_adam_steps_by_the_sign_of_the_gradient_sgd_follows(update: Callable[..., tuple[np.ndarray, dict]]) -> None:
    # Adam's first step is lr * g / (|g| + eps): about lr on every coordinate with a real gradient, in the
    # direction of SGD's step on the same batch (the same gradient).
    sgd, _ = update(optimizer="sgd", lr=1.0, clip=0)
    adam, _ = update(optimizer="adam", lr=1e-3, clip=0)
    strong = np.abs(sgd) > 1e-4
    assert strong.sum() > 1000
    assert (np.sign(adam[strong]) == np.sign(sgd[strong])).all()
    np.testing.assert_allclose(np.abs(adam[strong]), 1e-3, rtol=0.05)


def test_clipping_bounds_the_sgd_step(update: Callable[..., tuple[np.ndarray, dict]]) -> None:
    free, _ = update(optimizer="sgd", lr=1.0, clip=0)
    clipped, _ = update(optimizer="sgd", lr=1.0, clip=0.01)
    # one step: the change is lr * the clipped gradient, whose norm is at most 0.01 (gradients here are larger)
    assert np.linalg.norm(free) > 0.02
    assert np.linalg.norm(clipped) == pytest.approx(0.01, rel=1e-3)
    np.testing.assert_allclose(clipped / np.linalg.norm(clipped), free / np.linalg.norm(free), atol=1e-5)


def test_steps_and_batch_size_are_the_recipe(update: Callable[..., tuple[np.ndarray, dict]]) -> None:
    _, metrics = update(3, optimizer="sgd", lr=0.1)
    assert metrics["steps"] == 3


@pytest.mark.parametrize("recipe", [
    {},
    {"optimizer": "sgd", "lr": 0.1},
    {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "clip": 0.05},
    {"optimizer": "adam", "lr": 1e-2, "clip": 0},
])
def test_bytetext_local_trains_a_unit_as_bytetext_does(recipe: dict) -> None:
    # One model and one recipe: given the same bytes and seed (under the local cap), a bytetext-local unit is a
    # bytetext unit, bit for bit, under each recipe; and the recipe changes the result (it is not ignored).
    initial, text, _ = trained(ByteTextTask, 2, **recipe)
    same_initial, local, _ = trained(ByteTextLocalTask, 2, **recipe)
    assert initial.tobytes() == same_initial.tobytes()
    assert local.tobytes() == text.tobytes()
    if recipe:
        assert local.tobytes() != trained(ByteTextLocalTask, 2)[1].tobytes()


def test_bytetext_local_takes_bytetexts_recipe_defaults() -> None:
    recipe = ("steps", "batch_size", "lr", "optimizer", "momentum", "clip")
    text, local = ByteTextTask().settings_json(), ByteTextLocalTask().settings_json()
    assert {k: local[k] for k in recipe} == {k: text[k] for k in recipe}


@pytest.mark.parametrize("task", [ByteTextTask, ByteTextLocalTask, ArithTask])
@pytest.mark.parametrize("recipe, message", [
    ({"optimizer": "lion"}, "optimizer must be one of adam, sgd, got 'lion'"),
    ({"optimizer": "sgd", "momentum": 1.0}, "momentum must be in \\[0, 1\\)"),
    ({"optimizer": "adam", "momentum": 0.9}, "momentum is an SGD setting"),
    ({"clip": -1.0}, "clip must be >= 0"),
    ({"lr": 0.0}, "lr"),
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
