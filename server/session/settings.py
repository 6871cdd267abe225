"""Settings declared once. A dataclass field carries its help text, bounds and flag in its metadata
(``field(default=..., metadata=setting(help=..., minimum=...))``); from there come the command-line flags of
``serve`` and ``simulate``, the admin API's JSON schema, the reading of a ``--config`` TOML file and the one check
of a value, so a bad value gets the same words from a flag, a file and the admin API.

A leaf module (stdlib only): ``server.session.config`` (``SessionConfig``) and ``server.relay.options``
(``RelayOptions``) both declare their fields with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import numbers
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METADATA_KEY = "peertrain.setting"
COMMANDS = ("serve", "simulate")


class SessionError(ValueError):
    """A session was asked for something its state does not allow; the message says what."""


class SettingError(SessionError):
    """A setting's value is refused. ``key`` is the setting, ``problem`` the words every entry point shows;
    ``name`` is how the user wrote it (``--round-deadline``, ``session.toml: round_deadline``; default the key)."""

    def __init__(self, key: str, problem: str, *, name: str = "") -> None:
        super().__init__(f"{name or key} {problem}")
        self.key, self.problem, self.name = key, problem, name or key

    def named(self, name: str) -> SettingError:
        return SettingError(self.key, self.problem, name=name)


@dataclass(frozen=True)
class Setting:
    """What a field declares beside its type and default."""

    help: str
    flag: str = ""  # the long flag (default: --the-name; --no-the-name for a boolean that is on by default)
    short: str = ""  # e.g. -k
    aliases: tuple[str, ...] = ()  # older spellings still accepted (--rounds)
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # an exclusive lower bound
    choices: tuple[str, ...] = ()
    registry: str = ""  # "module:NAME": the choices are a registry's keys, read when first needed (it may import numpy)
    what: str = ""  # what the value is, in a refusal: "a share", "a number of seconds"
    metavar: str | None = None
    default_text: str = ""  # how --help says the default where the value alone would not
    none_flag: str = ""  # a flag that sets None (--no-backups)
    none_help: str = ""
    none_word: str = ""  # a word read as None on the command line and in a file (TOML has no null): "all"
    env: str = ""  # an environment variable read when neither a flag nor the file sets it
    commands: tuple[str, ...] = COMMANDS  # the commands with a flag for it
    # A command whose default differs from the field's: {command: (default, why)}.
    command_defaults: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    group: str = ""  # the --help section (each command names its own)
    admin: bool = False  # POST /api/admin/session may change it


def setting(*, help: str, **more: Any) -> dict[str, Setting]:  # noqa: A002 (argparse's word)
    """A field's metadata: ``field(default=..., metadata=setting(help=..., minimum=1))``."""
    return {METADATA_KEY: Setting(help=help, **more)}


@dataclass(frozen=True)
class Declared:
    """One declared field: its name, what it declares, its value's kind (bool, int, float, str or dict)."""

    name: str
    setting: Setting
    kind: type
    optional: bool  # None is a value
    default: Any  # dataclasses.MISSING for a required field
    literal: tuple[str, ...]  # the choices a Literal type names

    @property
    def flag(self) -> str:
        if self.setting.flag:
            return self.setting.flag
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind is bool and self.default is True else f"--{dashed}"

    @property
    def flags(self) -> list[str]:
        return [f for f in (self.setting.short, self.flag, *self.setting.aliases) if f]

    def choices(self) -> tuple[str, ...]:
        if self.literal or self.setting.choices:
            return self.literal or self.setting.choices
        if self.setting.registry:
            module, _, name = self.setting.registry.partition(":")
            return tuple(getattr(importlib.import_module(module), name))
        return ()

    def default_for(self, command: str) -> Any:
        if command in self.setting.command_defaults:
            return self.setting.command_defaults[command][0]
        return self.default


@functools.cache
def declarations(cls: type) -> tuple[Declared, ...]:
    """The fields of dataclass ``cls`` that declare a setting, in their order."""
    hints = typing.get_type_hints(cls)
    found = []
    for item in dataclasses.fields(cls):
        declared = item.metadata.get(METADATA_KEY)
        if declared is None:
            continue
        kind, optional, literal = value_kind(hints[item.name])
        if item.default is not dataclasses.MISSING:
            default = item.default
        elif item.default_factory is not dataclasses.MISSING:
            default = item.default_factory()
        else:
            default = dataclasses.MISSING
        found.append(Declared(item.name, declared, kind, optional, default, literal))
    return tuple(found)


def declared(cls: type, command: str | None = None) -> dict[str, Declared]:
    """Name -> declaration, those of ``command`` only when given."""
    return {d.name: d for d in declarations(cls) if command is None or command in d.setting.commands}


def value_kind(hint: Any) -> tuple[type, bool, tuple[str, ...]]:
    """(kind, optional, literal choices) of a field's type: ``float | None`` -> (float, True, ())."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"a setting has one type (or it and None), not {hint!r}")
        optional, hint = True, rest[0]
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return str, optional, tuple(str(a) for a in typing.get_args(hint))
    if hint in (bool, int, float, str):
        return hint, optional, ()
    if hint is dict or origin in (dict, Mapping):
        return dict, optional, ()
    raise TypeError(f"no setting kind for {hint!r}")


# -- the one check ------------------------------------------------------------------------------------------------

KIND_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text", dict: "a table of settings"}


def bounds_text(setting: Setting) -> str:
    low = f"above {setting.above:g}" if setting.above is not None else \
        f"{setting.minimum:g} or more" if setting.minimum is not None else ""
    if setting.maximum is None:
        return low
    if setting.minimum is not None and setting.above is None:
        return f"between {setting.minimum:g} and {setting.maximum:g}"
    return f"{low} and at most {setting.maximum:g}" if low else f"{setting.maximum:g} or less"


def check(item: Declared, value: Any) -> Any:
    """``value`` if the setting takes it, else a ``SettingError`` naming the setting and what it takes."""
    setting = item.setting
    if value is None:
        if item.optional:
            return None
    elif item.kind is bool:
        if isinstance(value, bool):
            return value
    elif item.kind is dict:
        if isinstance(value, Mapping):
            return value
    elif item.kind is str:
        if isinstance(value, str):
            choices = item.choices()
            if choices and value not in choices:
                raise SettingError(item.name, f"must be one of {', '.join(choices)}, got {json.dumps(value)}")
            return value
    elif isinstance(value, numbers.Integral if item.kind is int else numbers.Real) and not isinstance(value, bool):
        number: float = int(value) if isinstance(value, numbers.Integral) else float(value)  # (a huge int stays exact)
        if (setting.minimum is not None and number < setting.minimum) or \
                (setting.maximum is not None and number > setting.maximum) or \
                (setting.above is not None and not number > setting.above) or number != number:
            words = bounds_text(setting) if not setting.what else f"{setting.what} {bounds_text(setting)}"
            shown = str(int(value)) if isinstance(value, numbers.Integral) else f"{number:g}"
            raise SettingError(item.name, f"must be {words}, got {shown}")
        return value
    expected = setting.what or KIND_WORDS[item.kind]
    bounds = bounds_text(setting)
    taken = f"{expected} ({bounds})" if bounds else expected
    if item.optional and setting.none_word:
        taken += f" or {setting.none_word!r}"
    raise SettingError(item.name, f"must be {taken}, got {json.dumps(value, default=repr)}")


def check_fields(instance: Any) -> None:
    """Every declared field of a dataclass instance, checked (the first refused one raises)."""
    cls: type = type(instance)
    for item in declarations(cls):
        check(item, getattr(instance, item.name))


# -- the admin API's JSON schema ----------------------------------------------------------------------------------

JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object"}


def json_schema(cls: type, names: Iterable[str] | None = None) -> dict[str, dict[str, object]]:
    """JSON-schema properties of the declared fields (``names`` only, when given): type, bounds, fixed choices
    (a registry's are left to the check: reading one imports the runtime) and the help as description."""
    items = declared(cls)
    properties: dict[str, dict[str, object]] = {}
    for name in (names if names is not None else items):
        item = items[name]
        kind = JSON_TYPES[item.kind]
        schema: dict[str, object] = {"type": [kind, "null"] if item.optional else kind}
        for key, value in (("minimum", item.setting.minimum), ("maximum", item.setting.maximum),
                           ("exclusiveMinimum", item.setting.above)):
            if value is not None:
                schema[key] = value
        if item.literal or item.setting.choices:
            schema["enum"] = list(item.choices())
        schema["description"] = item.setting.help
        properties[name] = schema
    return properties


# -- command-line flags -------------------------------------------------------------------------------------------

def text_reader(item: Declared) -> Any:
    """argparse's ``type=`` for a setting: the text read as the setting's kind (JSON for a table)."""
    def read(text: str) -> Any:
        if item.setting.none_word and text.strip().lower() == item.setting.none_word:
            return None
        try:
            if item.kind is dict:
                value = json.loads(text)
                if not isinstance(value, dict):
                    raise ValueError("not a JSON object")
                return value
            return item.kind(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected {item.setting.what or KIND_WORDS[item.kind]}"
                                             f"{' as JSON' if item.kind is dict else ''}, got {text!r}") from error
    read.__name__ = item.kind.__name__
    return read


def help_text(item: Declared, command: str) -> str:
    """The help with the default said once: the declared words, else the value."""
    text = item.setting.help
    if item.kind is bool:
        return text
    default = item.default_for(command)
    said = ("" if default in (None, {}, "", dataclasses.MISSING) else
            f"{default:g}" if isinstance(default, float) else str(default))
    if item.setting.default_text and command not in item.setting.command_defaults:
        said = item.setting.default_text
    env = f"env {item.setting.env}" if item.setting.env else ""
    extra = "; ".join(p for p in (f"default {said}" if said else "", env) if p)
    return f"{text} ({extra})" if extra else text


def add_flags(parser: argparse.ArgumentParser, cls: type, command: str, *,
              groups: Mapping[str, Any] | None = None, skip: Sequence[str] = ()) -> None:
    """A flag for every setting of ``cls`` that ``command`` has (``groups``: the --help section per declared group).
    Defaults stay out of the namespace (``argparse.SUPPRESS``): ``explicit`` reads what was typed, so a flag
    overrides a ``--config`` file and the file overrides the declared default."""
    for item in declarations(cls):
        if command not in item.setting.commands or item.name in skip:
            continue
        target = (groups or {}).get(item.setting.group, parser)
        common: dict[str, Any] = {"dest": item.name, "default": argparse.SUPPRESS, "help": help_text(item, command)}
        if item.setting.none_flag:
            target = target.add_mutually_exclusive_group()
        if item.kind is bool:
            target.add_argument(*item.flags, action="store_false" if item.default is True else "store_true",
                                **common)
        else:
            choices = item.choices()
            target.add_argument(*item.flags, type=text_reader(item), choices=choices or None,
                                metavar=item.setting.metavar, **common)
        if item.setting.none_flag:
            target.add_argument(item.setting.none_flag, dest=item.name, action="store_const", const=None,
                                default=argparse.SUPPRESS, help=item.setting.none_help)


def explicit(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``cls`` given as flags on this command line."""
    given = vars(args)
    return {name: given[name] for name in declared(cls) if name in given}


def flag_name(cls: type, name: str) -> str:
    return declared(cls)[name].flag


# -- an object back to flags --------------------------------------------------------------------------------------

def arguments(instance: Any, command: str = "serve") -> list[str]:
    """The flags that make ``command``'s parser (``add_flags``, then ``combine``) build ``instance`` again: one for
    each declared field whose value differs from what a command line without it gives (the command's default,
    as the dataclass makes it, so a normalised default such as an empty table is not said), and every required
    field. Each is ``--flag=VALUE`` (a value may start with a dash). A value the command cannot be given (a field
    it has no flag for, None without a flag or a word for it) is a ``SettingError``. The environment is left out:
    a field with an ``env`` left at its default can still be set by that variable where the command runs."""
    cls: type = type(instance)
    said: list[str] = []
    for item in declarations(cls):
        value = getattr(instance, item.name)
        if item.default is not dataclasses.MISSING and is_default(instance, item, command):
            continue
        if command not in item.setting.commands:
            raise SettingError(item.name, f"cannot be given to {command} (it has no flag for it), got "
                               f"{json.dumps(value, default=repr)}")
        said.append(flag_argument(item, value))
    return said


def is_default(instance: Any, item: Declared, command: str) -> bool:
    """Whether ``instance`` is what it would be with ``item`` left at ``command``'s default: the dataclass's own
    normalisation decides (an ``aggregate_config`` of None becomes its aggregator's defaults), in the context of the
    other fields; a default those fields refuse means the value must be said."""
    try:
        return bool(dataclasses.replace(instance, **{item.name: item.default_for(command)}) == instance)
    except (TypeError, ValueError):
        return False


def flag_argument(item: Declared, value: Any) -> str:
    """The one argument that sets ``item`` to ``value``, as ``text_reader`` and the flag's action read it."""
    if value is None:
        if item.setting.none_flag:
            return item.setting.none_flag
        if item.setting.none_word:
            return f"{item.flag}={item.setting.none_word}"
        raise SettingError(item.name, "cannot be None on the command line (no flag or word says it)")
    if item.kind is bool:
        if bool(value) == bool(item.default):  # (a flag turns it away from the field's default, never back)
            raise SettingError(item.name, f"cannot be {json.dumps(bool(value))} on this command line")
        return item.flag
    if item.kind is dict:
        text = json.dumps(dict(value))
    elif item.kind is float and isinstance(value, float):
        text = repr(value)  # (the shortest text float() reads back to the same number)
    else:
        text = str(value)
    if item.setting.none_word and text.strip().lower() == item.setting.none_word:
        raise SettingError(item.name, f"cannot be {text!r} on the command line: it reads as None")
    return f"{item.flag}={text}"


# -- a settings file ----------------------------------------------------------------------------------------------

def read_file(path: Path, accepted: Mapping[str, Declared], *, command: str,
              elsewhere: Iterable[str] = ()) -> dict[str, Any]:
    """A TOML file's settings, each checked; an unknown key or a bad value is a ``SettingError`` naming the file
    and the key. ``elsewhere``: settings other commands take (refused with that said)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as error:
        raise SettingError("--config", f"cannot be read: {error.strerror}: {path}", name="--config") from error
    except tomllib.TOMLDecodeError as error:
        raise SettingError("--config", f"is not TOML: {path}: {error}", name="--config") from error
    values = {}
    others = set(elsewhere)
    for key, value in data.items():
        where = f"{path}: {key}"
        if key not in accepted:
            problem = (f"is not a setting of {command} (another command's)" if key in others else
                       f"is not a setting (the settings of {command}: {', '.join(sorted(accepted))})")
            raise SettingError(key, problem, name=where)
        item = accepted[key]
        if item.optional and item.setting.none_word and isinstance(value, str) and \
                value.strip().lower() == item.setting.none_word:
            value = None
        try:
            values[key] = check(item, value)
        except SettingError as error:
            raise error.named(where) from None
    return values


def combine(cls: type, command: str, flags: Mapping[str, Any], from_file: Mapping[str, Any],
            environ: Mapping[str, str]) -> dict[str, Any]:
    """The keyword arguments of ``cls`` for ``command``: a flag, else the setting's environment variable, else the
    file, else the command's own default (a field's default is left to the dataclass). Flags are checked here
    (the file's were when read)."""
    values: dict[str, Any] = {}
    for item in declared(cls, command).values():
        if item.name in flags:
            try:
                values[item.name] = check(item, flags[item.name])
            except SettingError as error:
                raise error.named(item.flag) from None
        elif item.setting.env and environ.get(item.setting.env):
            values[item.name] = environ[item.setting.env]
        elif item.name in from_file:
            values[item.name] = from_file[item.name]
        elif command in item.setting.command_defaults:
            values[item.name] = item.default_for(command)
    return values


# -- the settings page's tables (docs/sessions/settings.md) -------------------------------------------------------

def takes_text(item: Declared) -> str:
    """What a setting takes, in a cell of the settings page's tables: its kind, bounds or choices, and None's word."""
    choices = item.literal or item.setting.choices
    if choices:
        text = " \\| ".join(f"`{c}`" for c in choices)
    elif item.setting.registry:
        text = f"a name in `{item.setting.registry.replace(':', '.')}`"
    else:
        bounds = bounds_text(item.setting)
        text = (item.setting.what or KIND_WORDS[item.kind]) + (f", {bounds}" if bounds else "")
    if item.setting.none_word:
        text += f", or `\"{item.setting.none_word}\"`"
    return text


def markdown_table(cls: type, commands: Sequence[str] = COMMANDS) -> str:
    """The settings page's table of ``cls``'s settings: the file key, the flags, the default (per command where they
    differ), what it takes, the commands that have it, what it does."""
    rows = ["| key | flag | default | takes | " + " | ".join(commands) + " | what it does |",
            "| --- | --- | --- | --- | " + " | ".join("---" for _ in commands) + " | --- |"]
    for item in declarations(cls):
        flags = ", ".join(f"`{f}`" for f in (*item.flags, item.setting.none_flag) if f)
        said = {c: help_text(item, c).rpartition("(default ")[2].removesuffix(")").partition("; env")[0]
                for c in commands if c in item.setting.commands and "(default " in help_text(item, c)}
        default = next(iter(said.values())) if len(set(said.values())) == 1 else \
            "; ".join(f"{c}: {text}" for c, text in said.items())
        if item.kind is bool:
            default = "on" if item.default else "off"
        where = " | ".join("yes" if c in item.setting.commands else "" for c in commands)
        cells = [f"`{item.name}`", flags, default, takes_text(item), where, item.setting.help]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") if n in (2, 5) else cell
                                      for n, cell in enumerate(cells)) + " |")
    return "\n".join(rows) + "\n"
