"""The language-model recipe declared once (``runtime.tasks.lm_recipe.LMRecipe``): every LM task's settings inherit
it, one check holds each declared field to its bounds with words that name the setting, the bound and the value,
and the settings go to JSON and back."""

from __future__ import annotations

import dataclasses
import json

import pytest

from runtime.tasks.arith import ArithTask, ArithTaskSettings
from runtime.tasks.base import TaskError
from runtime.tasks.bytetext import ByteTextTask
from runtime.tasks.bytetext_local import ByteTextLocalTask
from runtime.tasks.lm_recipe import RECIPE_FIELDS, LMRecipe
from runtime.tasks.settings import METADATA_KEY, declarations

LM_TASKS = (ArithTask, ByteTextTask, ByteTextLocalTask)
RECIPE = ("model", "steps", "batch_size", "lr", "optimizer", "momentum", "clip")


def test_the_recipe_is_declared_once_with_help_and_bounds() -> None:
    assert tuple(RECIPE_FIELDS) == RECIPE
    assert all(item.setting.help for item in declarations(LMRecipe))
    for task in LM_TASKS:
        assert issubclass(task.Settings, LMRecipe)
        # A task gives a recipe field another default (arith: its preset, its batch, steps 0 meaning "epochs"), and
        # keeps the declared help and bounds unless the field means something else there (arith's steps).
        for name in RECIPE:
            declared = next(f for f in dataclasses.fields(task.Settings) if f.name == name).metadata[METADATA_KEY]
            assert declared == RECIPE_FIELDS[name].metadata[METADATA_KEY] or (task, name) == (ArithTask, "steps")


def test_the_defaults_are_the_recipes_each_task_had() -> None:
    recipes = {task.name: {k: task().settings_json()[k] for k in RECIPE} for task in LM_TASKS}
    common = {"lr": 3e-3, "optimizer": "adam", "momentum": 0.0, "clip": 1.0}
    assert recipes == {"arith": {"model": "arith", "steps": 0, "batch_size": 32, **common},
                       "bytetext": {"model": "bytelm-2.3mb", "steps": 8, "batch_size": 16, **common},
                       "bytetext-local": {"model": "bytelm-2.3mb", "steps": 8, "batch_size": 16, **common}}


@pytest.mark.parametrize("task", LM_TASKS)
@pytest.mark.parametrize(("settings", "message"), [
    ({"lr": 0}, "lr must be > 0, got 0"),
    ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ({"clip": float("nan")}, "clip must be >= 0, got nan"),
    ({"optimizer": "sgd", "momentum": -0.5}, r"momentum must be in \[0, 1\), got -0.5"),
    ({"steps": "many"}, "steps must be a whole number >= [01], got 'many'"),
    ({"batch_size": 8.0}, "batch_size must be a whole number >= 1, got 8.0"),
    ({"lr": True}, "lr must be a number > 0, got True"),
    ({"model": "huge"}, "model must be one of .*, got 'huge'"),
])
def test_a_refusal_names_the_setting_the_bound_and_the_value(task: type, settings: dict, message: str) -> None:
    with pytest.raises(TaskError, match=f"^task '{task.name}': bad settings: {message}$"):
        task(settings)


def test_a_tasks_own_settings_are_checked_by_the_same_routine() -> None:
    with pytest.raises(TaskError, match=r"final_lr_ratio must be in \[0, 1\], got 2"):
        ArithTask({"final_lr_ratio": 2})
    with pytest.raises(TaskError, match=r"session_final_lr_ratio must be in \(0, 1\], got 0"):
        ArithTask({"session_final_lr_ratio": 0})
    with pytest.raises(TaskError, match="n_layer must be >= 1 or null, got 0"):
        ArithTask({"n_layer": 0})
    assert ArithTask({"n_layer": None}).settings.n_layer is None
    with pytest.raises(TaskError, match=r"holdout must be in \[0, 1\), got 1"):
        ByteTextLocalTask({"holdout": 1})
    with pytest.raises(TaskError, match="report_half must be true or false, got 'yes'"):
        ByteTextTask({"report_half": "yes"})


@pytest.mark.parametrize("task", LM_TASKS)
def test_settings_round_trip_through_json(task: type) -> None:
    changed = {"lr": 0.5, "optimizer": "sgd", "momentum": 0.9, "clip": 0.0}
    settings = task(changed).settings
    again = type(settings).from_json(settings.to_json())
    assert again == settings and again.to_json() == task(changed).settings_json()
    assert type(settings).from_json(json.dumps(settings.to_json())) == settings
    with pytest.raises(TaskError, match=r"unknown setting\(s\) \['epoch'\]"):
        type(settings).from_json({**settings.to_json(), "epoch": 3})


def test_the_bare_recipe_and_arith_lists_round_trip() -> None:
    recipe = LMRecipe(lr=0.1)
    assert LMRecipe.from_json(recipe.to_json()) == recipe and recipe.to_json()["model"] == "bytelm-2.3mb"
    settings = ArithTaskSettings(operators=["+", "-"])
    assert settings.operators == ("+", "-") and ArithTaskSettings.from_json(settings.to_json()) == settings
