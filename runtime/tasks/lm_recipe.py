"""The language-model recipe, declared once: the model preset and how a peer trains one unit.

Every language-model task's settings (``runtime.tasks.lm_task.LMTask``: ``bytetext``, ``bytetext-local``, ``arith``)
are an :class:`LMRecipe` and the task's own fields (where its data comes from, a tokenizer, how it is judged): the
task's ``Settings`` dataclass inherits the recipe, so its settings stay one flat JSON object, and ``--set lr=1.0``
names a recipe field as it names any other. Each field carries its help and bounds (``runtime.tasks.settings``);
one check holds every declared field of the task's settings to them, and the one rule between two fields
(momentum belongs to SGD) is :meth:`LMRecipe.__post_init__`'s.

The defaults are the byte-level tasks' tuned recipe (``peertrain bench comm`` and the studies in BENCHMARKS.md ran
on it); a task whose model or data want others says so with ``recipe_default`` (arith: its own preset, 32 problems
a batch), keeping the field's help and bounds.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Self

from runtime.models.transformer import PRESETS
from runtime.tasks.base import TaskError
from runtime.tasks.lm import LOCAL_OPTIMIZERS
from runtime.tasks.settings import check_settings, setting


@dataclass(frozen=True, kw_only=True)
class LMRecipe:
    """The model and the local training of one unit: ``steps`` steps of a fresh ``optimizer`` (so a retried unit
    repeats exactly) on batches of ``batch_size`` rows, at learning rate ``lr``, each step's gradients clipped to
    the global norm ``clip``."""

    model: str = field(default="bytelm-2.3mb", metadata=setting(
        help="the transformer: a preset of runtime.models.transformer (a task may override its sizes)",
        choices=tuple(PRESETS)))
    steps: int = field(default=8, metadata=setting(help="optimizer steps per unit", minimum=1))
    batch_size: int = field(default=16, metadata=setting(help="rows (windows of text, problems) per step", minimum=1))
    lr: float = field(default=3e-3, metadata=setting(help="the local learning rate", above=0))
    optimizer: str = field(default="adam", metadata=setting(
        help="the local optimizer, a fresh one per unit (runtime.tasks.lm.local_optimizer)", choices=LOCAL_OPTIMIZERS))
    momentum: float = field(default=0.0, metadata=setting(
        help="sgd only: heavy-ball momentum (0: plain SGD, as the clients of Reddi et al. 2021)", minimum=0, below=1))
    clip: float = field(default=1.0, metadata=setting(
        help="clip each step's gradients to this global norm (0: no clipping)", minimum=0))

    def __post_init__(self) -> None:
        check_settings(self)  # (the subclass's declared fields too)
        if self.optimizer == "adam" and self.momentum:
            raise TaskError("momentum is an SGD setting (Adam has its own betas); leave it 0 with adam")

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON (tuples become lists), what ``from_json`` reads back."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_json(cls, data: object) -> Self:
        """The settings ``to_json`` wrote (a dict, or its JSON text); an unknown key is refused, naming it."""
        if isinstance(data, str | bytes):
            data = json.loads(data)
        if not isinstance(data, dict):
            raise TaskError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TaskError(f"{cls.__name__}: unknown setting(s) {unknown}")
        return cls(**data)


RECIPE_FIELDS = {item.name: item for item in dataclasses.fields(LMRecipe)}


def recipe_default(name: str, default: Any) -> Any:
    """The recipe's field ``name`` as declared (help, bounds) with a task's own default:
    ``model: str = recipe_default("model", "arith")`` in the task's ``Settings``."""
    return field(default=default, metadata=RECIPE_FIELDS[name].metadata)
