"""A task's setting declared once: a dataclass field carrying its help text and bounds in its metadata,
``field(default=..., metadata=setting(help=..., minimum=0))``, and one check of every declared field.

The relay declares its own settings the same way (``server.session.settings``); this is the runtime's copy of that
convention, kept to what a task's settings need (no flags or files: a task's settings arrive as JSON, from
``--set key=value`` or a package), because the runtime imports only numpy and the standard library and a peer
checks settings too. A refusal names the setting, the bound and the value: ``lr must be > 0, got 0.0``.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import types
import typing
from dataclasses import dataclass
from typing import Any

from runtime.tasks.base import TaskError

METADATA_KEY = "peertrain.task_setting"


@dataclass(frozen=True)
class Setting:
    """What a field declares beside its type and default: its help, and the bounds the one check holds it to."""

    help: str
    minimum: float | None = None  # inclusive bounds
    maximum: float | None = None
    above: float | None = None  # exclusive bounds
    below: float | None = None
    choices: tuple[str, ...] = ()  # the values a text setting takes


def setting(*, help: str, **bounds: Any) -> dict[str, Setting]:  # noqa: A002 (the word the relay's settings use)
    """A field's metadata: ``field(default=..., metadata=setting(help=..., minimum=1))``."""
    return {METADATA_KEY: Setting(help=help, **bounds)}


@dataclass(frozen=True)
class Declared:
    """One declared field: its name, its declaration, the kind of value it holds (bool, int, float or str; None
    for a kind the check leaves alone, such as a tuple of file names) and whether None is a value."""

    name: str
    setting: Setting
    kind: type | None
    optional: bool


@functools.cache
def declarations(cls: type) -> tuple[Declared, ...]:
    """The fields of dataclass ``cls`` that declare a setting, in field order (a base class's first)."""
    hints = typing.get_type_hints(cls)
    found = []
    for item in dataclasses.fields(cls):
        declared = item.metadata.get(METADATA_KEY)
        if declared is not None:
            kind, optional = value_kind(hints[item.name])
            found.append(Declared(item.name, declared, kind, optional))
    return tuple(found)


def value_kind(hint: Any) -> tuple[type | None, bool]:
    """(kind, optional) of a field's type: ``int | None`` -> (int, True); ``tuple[str, ...]`` -> (None, False)."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = True, (rest[0] if len(rest) == 1 else None)
    return (hint if hint in (bool, int, float, str) else None), optional


def bounds_text(setting: Setting) -> str:
    """The bounds as a reader writes them: ``>= 0``, ``> 0``, ``in [0, 1)``, ``one of adam, sgd``."""
    if setting.choices:
        return f"one of {', '.join(setting.choices)}"
    low = (f"[{setting.minimum:g}" if setting.minimum is not None else
           f"({setting.above:g}" if setting.above is not None else "")
    high = (f"{setting.maximum:g}]" if setting.maximum is not None else
            f"{setting.below:g})" if setting.below is not None else "")
    if low and high:
        return f"in {low}, {high}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1:]}"
    if high:
        return f"{'<=' if high[-1] == ']' else '<'} {high[:-1]}"
    return ""


KIND_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def within(setting: Setting, value: Any) -> bool:
    return value == value and all((  # (NaN is within no bounds)
        setting.minimum is None or value >= setting.minimum, setting.maximum is None or value <= setting.maximum,
        setting.above is None or value > setting.above, setting.below is None or value < setting.below))


def check(item: Declared, value: Any) -> None:
    """Refuse ``value`` for the declared setting with a ``TaskError`` naming the setting, what it takes and the
    value: ``momentum must be in [0, 1), got 1.0``; ``steps must be a whole number >= 1, got 'many'``."""
    setting = item.setting
    if item.kind is None or (value is None and item.optional):
        return
    bounds = bounds_text(setting)
    if item.kind is str:
        ok, wanted = isinstance(value, str) and (not setting.choices or value in setting.choices), bounds or "text"
    elif item.kind is bool:
        ok, wanted = isinstance(value, bool), KIND_WORDS[bool]
    elif isinstance(value, numbers.Integral if item.kind is int else numbers.Real) and not isinstance(value, bool):
        ok, wanted = within(setting, value), bounds
    else:  # the wrong kind of value: say the kind too
        ok, wanted = False, KIND_WORDS[item.kind] + (f" {bounds}" if bounds else "")
    if not ok:
        raise TaskError(f"{item.name} must be {wanted}{' or null' if item.optional else ''}, got {value!r}")


def check_settings(instance: Any) -> None:
    """Every declared field of a dataclass instance, checked in field order (the first refused one raises)."""
    cls: type = type(instance)
    for item in declarations(cls):
        check(item, getattr(instance, item.name))
