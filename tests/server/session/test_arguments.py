"""``server.session.settings.arguments``: a settings object back to the flags that build it again. For every
declared field of ``SessionConfig``, ``RelayOptions`` and ``ServerLimits``, a value other than serve's default goes
through the flags and serve's own parser and comes back the same object."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from server.cli.options import read_limits, read_settings
from server.cli.serve import add_arguments
from server.relay.options import RelayOptions, ServerLimits
from server.session.config import SessionConfig
from server.session.settings import Declared, SettingError, arguments, check, declarations, setting

ADMIN = "-a token that starts with a dash"  # (said as --admin-token=..., so argparse reads it as a value)


def served(flags: list[str]) -> tuple[SessionConfig, RelayOptions, ServerLimits]:
    """What ``peertrain serve`` builds from ``flags`` (its parser, its reading of flags; no file, no environment)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(flags)
    config_values, relay_values = read_settings(args, "serve", environ={})
    return SessionConfig(**config_values), RelayOptions(**relay_values), read_limits(args)


def other_values(item: Declared) -> list[Any]:
    """Values of ``item`` other than serve's default that its check takes: None where it may be None, and one more."""
    default = item.default_for("serve")
    values: list[Any] = [None] if item.optional and default is not None and \
        (item.setting.none_flag or item.setting.none_word) else []
    if item.kind is bool:
        return [not item.default]
    if item.kind is dict:
        return [*values, {"eta": 0.01, "nested": {"list": [1, 2.5]}}]
    if item.kind is str:
        choices = item.choices()
        return [*values, next(c for c in choices if c != default) if choices else "-x y"]
    low = item.setting.minimum if item.setting.minimum is not None else item.setting.above or 0
    middle = [(item.setting.maximum - low) / 3] if item.setting.maximum is not None else []
    for step in (0.0, *middle, 0.1, 0.37, 1.5, 7.0):
        value = item.kind(low + step) if item.kind is int else low + step
        try:
            if value != default and check(item, value) == value:
                return [*values, value]
        except SettingError:
            pass
    raise AssertionError(f"no other value for {item.name}")


BASE_CONFIG = SessionConfig(participants=3)  # serve's defaults
BASE_OPTIONS = RelayOptions(admin_token=ADMIN)
DP_BASE = SessionConfig(participants=3, dp_noise_multiplier=1.1, aggregate="mean")  # (dp_* need noise, and the mean)
BASE_LIMITS = ServerLimits()
CASES = [(cls, item.name, value) for cls in (SessionConfig, RelayOptions, ServerLimits) for item in declarations(cls)
         for value in other_values(item)]


@pytest.mark.parametrize(("cls", "name", "value"), CASES, ids=[f"{c[1]}={c[2]!r}" for c in CASES])
def test_every_setting_round_trips_through_serves_parser(cls: type, name: str, value: Any) -> None:
    if cls is SessionConfig:
        base = DP_BASE if name.startswith("dp_") else BASE_CONFIG
        if name == "aggregate_config":
            base = dataclasses.replace(base, aggregate="trimmed_mean")
        config, options, limits = dataclasses.replace(base, **{name: value}), BASE_OPTIONS, BASE_LIMITS
    elif cls is RelayOptions:
        config, options, limits = BASE_CONFIG, dataclasses.replace(BASE_OPTIONS, **{name: value}), BASE_LIMITS
    else:
        config, options, limits = BASE_CONFIG, BASE_OPTIONS, dataclasses.replace(BASE_LIMITS, **{name: value})
    flags = [*arguments(config), *arguments(options), *arguments(limits)]
    assert served(flags) == (config, options, limits), flags


def test_only_what_differs_from_serves_defaults_is_said() -> None:
    assert arguments(SessionConfig(participants=3)) == []
    assert arguments(SessionConfig()) == ["--participants=5"]  # (serve's own default is 3)
    assert arguments(RelayOptions(admin_token="t")) == ["--admin-token=t"]  # (a required field is always said)
    # An aggregator's settings left to their defaults are not said, whichever aggregator.
    assert arguments(SessionConfig(participants=3, aggregate="mean")) == ["--aggregate=mean"]
    assert arguments(RelayOptions(admin_token="t", backup_after=None, keep_results=None, verify_direction=-0.5)) == [
        "--admin-token=t", "--verify-direction=-0.5", "--no-backups", "--keep-results=all"]
    assert arguments(ServerLimits()) == []
    assert served(["--admin-token=t"]) == (SessionConfig(participants=3), RelayOptions(admin_token="t"), ServerLimits())


@dataclass(kw_only=True)
class Knobs:
    count: int = field(default=3, metadata=setting(help="how many", commands=("serve",)))
    wait: float | None = field(default=1.0, metadata=setting(help="how long"))
    elsewhere: int = field(default=0, metadata=setting(help="another command's", commands=("other",)))
    mode: str = field(default="on", metadata=setting(help="a word", none_word="off"))
    plain: int = 4  # not a setting


def test_what_a_command_line_cannot_say_is_refused() -> None:
    assert arguments(Knobs(count=5, plain=9)) == ["--count=5"]  # (a field that is not a setting has no flag)
    with pytest.raises(SettingError, match="elsewhere cannot be given to serve"):
        arguments(Knobs(elsewhere=1))
    assert arguments(Knobs(elsewhere=1), "other") == ["--elsewhere=1"]
    with pytest.raises(SettingError, match="wait cannot be None on the command line"):
        arguments(Knobs(wait=None))
    with pytest.raises(SettingError, match="reads as None"):
        arguments(Knobs(mode="off"))
