"""Settings declared once (``server.session.settings``): the flags, the admin API's schema, a ``--config`` TOML
file and the checks all come from a dataclass field's declaration; the compatibility rules
(``server.session.rules.resolve``) hold on every way of starting a session."""

from __future__ import annotations

import argparse
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from relay_fixtures import ADMIN_TOKEN, build_small_package, make_relay, serving

from server import cli
from server.cli.commands import build_parser
from server.cli.options import read_settings
from server.relay.admin_endpoints import SESSION_SETTINGS
from server.relay.options import RelayOptions
from server.session.config import SETTABLE, SessionConfig, config_from_request
from server.session.package import Package
from server.session.rules import resolve
from server.session.settings import (
    SettingError,
    add_flags,
    check,
    declared,
    explicit,
    json_schema,
    markdown_table,
    setting,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_CONFIG = REPO_ROOT / "examples" / "session.toml"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass(kw_only=True)
class Knobs:
    """A synthetic declaration: one field of each kind the helper knows."""

    count: int = field(default=3, metadata=setting(help="how many", short="-n", minimum=1, aliases=("--many",)))
    share: float = field(default=0.5, metadata=setting(help="a part", minimum=0, maximum=1, what="a share"))
    wait: float | None = field(default=None, metadata=setting(help="how long", above=0, what="a number of seconds",
                                                              default_text="forever"))
    colour: Literal["red", "blue"] = field(default="red", metadata=setting(help="which colour"))
    loud: bool = field(default=False, metadata=setting(help="shout"))
    checked: bool = field(default=True, metadata=setting(help="do not check"))
    keep: int | None = field(default=1, metadata=setting(help="rounds kept", minimum=0, none_word="all"))
    backup: float | None = field(default=1.0, metadata=setting(help="after F", minimum=0, none_flag="--no-backup",
                                                               none_help="never"))
    table: dict = field(default_factory=dict, metadata=setting(help="settings as JSON"))
    hidden_here: int = field(default=0, metadata=setting(help="another command's", commands=("other",)))
    plain: int = 4  # not a setting: no flag


def knob_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="knobs", exit_on_error=False)
    add_flags(parser, Knobs, "serve")
    return parser


def test_flags_come_from_the_declaration() -> None:
    parser = knob_parser()
    assert explicit(Knobs, parser.parse_args([])) == {}  # defaults stay the declaration's, not the namespace's
    given = explicit(Knobs, parser.parse_args(["-n", "5", "--share", "0.25", "--wait", "2", "--colour", "blue",
                                               "--loud", "--no-checked", "--keep", "all", "--no-backup",
                                               "--table", '{"a": 1}']))
    assert given == {"count": 5, "share": 0.25, "wait": 2.0, "colour": "blue", "loud": True, "checked": False,
                     "keep": None, "backup": None, "table": {"a": 1}}
    assert explicit(Knobs, parser.parse_args(["--many", "7"])) == {"count": 7}
    text = parser.format_help()
    assert "how many (default 3)" in text and "how long (default forever)" in text and "--no-checked" in text
    assert "--hidden-here" not in text and "--plain" not in text
    for bad in (["--colour", "green"], ["--count", "x"], ["--table", "[1]"], ["--backup", "1", "--no-backup"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            parser.parse_args(bad)


def test_one_check_says_the_same_words_everywhere() -> None:
    items = declared(Knobs)
    refusals = {("count", 0): "must be 1 or more, got 0", ("share", 1.5): "must be a share between 0 and 1, got 1.5",
                ("wait", 0): "must be a number of seconds above 0, got 0",
                ("colour", "green"): 'must be one of red, blue, got "green"',
                ("count", "3"): 'must be a whole number (1 or more), got "3"',
                ("count", True): "must be a whole number (1 or more), got true",
                ("keep", "x"): "must be a whole number (0 or more) or 'all', got \"x\"",
                ("loud", 1): "must be true or false, got 1",
                ("share", None): "must be a share (between 0 and 1), got null"}
    for (name, value), problem in refusals.items():
        with pytest.raises(SettingError) as refused:
            check(items[name], value)
        assert (refused.value.key, refused.value.problem, str(refused.value)) == (name, problem, f"{name} {problem}")
    assert check(items["wait"], None) is None and check(items["share"], 1) == 1 and check(items["count"], 10**30)


def test_a_bad_value_gets_the_same_problem_from_a_flag_a_file_and_the_admin_api(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    problem = "must be above 1, got 1"
    with pytest.raises(SettingError) as from_admin:
        config_from_request({"divergence_factor": 1}, SessionConfig())
    assert str(from_admin.value) == f"divergence_factor {problem}"
    assert cli.main(["simulate", "--divergence-factor", "1", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"peertrain simulate: --divergence-factor {problem}"
    config = tmp_path / "bad.toml"
    config.write_text("divergence_factor = 1\n")
    assert cli.main(["simulate", "--config", str(config), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"peertrain simulate: {config}: divergence_factor {problem}"


def test_the_admin_schema_is_the_declaration() -> None:
    assert SESSION_SETTINGS == {**json_schema(SessionConfig, SETTABLE), "replace": SESSION_SETTINGS["replace"]}
    assert SETTABLE == tuple(name for name, item in declared(SessionConfig).items() if item.setting.admin)
    kinds = {"boolean": bool, "integer": int, "number": float, "string": str, "object": dict}
    for name in SETTABLE:
        item, schema = declared(SessionConfig)[name], SESSION_SETTINGS[name]
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        assert kinds[types[0]] is item.kind and ("null" in types) == item.optional, name
        assert schema.get("minimum") == item.setting.minimum and schema.get("maximum") == item.setting.maximum
        assert schema.get("exclusiveMinimum") == item.setting.above and schema["description"] == item.setting.help
    assert SESSION_SETTINGS["on_divergence"]["enum"] == ["stop", "rollback"]
    assert SESSION_SETTINGS["mode"]["enum"] == ["sync", "async"]
    assert set(declared(SessionConfig)).isdisjoint(declared(RelayOptions))  # one file namespace for both


def test_every_option_is_in_the_readme_and_the_settings_page() -> None:
    """The README lists every option by command; the settings page says what each does."""
    from server.cli import serve, simulate

    documents = {name: (REPO_ROOT / name).read_text() for name in ("README.md", "docs/sessions/settings.md")}
    for command, module in (("serve", serve), ("simulate", simulate)):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        flags = [flag for action in parser._actions for flag in action.option_strings
                 if flag.startswith("--") and flag != "--help"]
        for name, text in documents.items():
            missing = [flag for flag in flags if f"`{flag}" not in text]
            assert missing == [], f"{command} options missing from {name}: {missing}"
    # The tables are the declarations' (regenerate them with markdown_table after a change), and the example is
    # the file a test reads.
    settings = documents["docs/sessions/settings.md"]
    assert markdown_table(SessionConfig) in settings and markdown_table(RelayOptions) in settings
    assert f"```toml\n{EXAMPLE_CONFIG.read_text()}```" in settings


def test_the_example_file_round_trips(tmp_path: Path) -> None:
    data = tomllib.loads(EXAMPLE_CONFIG.read_text())
    session, relay = read_settings(build_parser().parse_args(["serve", "--config", str(EXAMPLE_CONFIG)]), "serve",
                                   environ={})
    assert relay == {} and session == {**data, "merge_config": dict(data["merge_config"])}
    config = SessionConfig(**session)
    assert config.merge == "fedavgm" and config.merge_config == {"server_momentum": 0.5} and config.passes == 2
    # Written back from the config it made, the file gives the same config.
    values = {k: v for k, v in config.to_json().items() if k in session}
    lines = [f"{k} = {json.dumps(v)}" for k, v in values.items() if not isinstance(v, dict)]
    lines += ["[merge_config]", *(f"{k} = {json.dumps(v)}" for k, v in values["merge_config"].items())]
    again = tmp_path / "again.toml"
    again.write_text("\n".join(lines) + "\n")
    session_again, _ = read_settings(build_parser().parse_args(["serve", "--config", str(again)]), "serve", environ={})
    assert SessionConfig(**session_again) == config


def test_a_flag_overrides_the_file_and_the_file_the_defaults(tmp_path: Path) -> None:
    config = tmp_path / "session.toml"
    config.write_text('participants = 4\npasses = 5\nlease_seconds = 60\nbackup_after = "off"\nkeep_results = "all"\n')
    args = build_parser().parse_args(["serve", "--config", str(config), "-k", "2", "--backup-after", "3"])
    session, relay = read_settings(args, "serve", environ={})
    assert session == {"participants": 2, "passes": 5}
    assert relay == {"lease_seconds": 60, "backup_after": 3.0, "keep_results": None}
    session, relay = read_settings(build_parser().parse_args(["serve"]), "serve", environ={})
    assert session == {"participants": 3} and relay == {}  # serve's own k, declared with its reason
    assert "participants" not in read_settings(build_parser().parse_args(["simulate"]), "simulate", environ={})[0]
    _, relay = read_settings(build_parser().parse_args(["serve", "--config", str(config)]), "serve",
                             environ={"PEERTRAIN_ADMIN_TOKEN": "from-env"})
    assert relay["admin_token"] == "from-env" and relay["backup_after"] is None


@pytest.mark.parametrize(("text", "expected"), [
    ("colour = 'red'\n", "{config}: colour is not a setting (the settings of serve: "),
    ("participants = 0\n", "{config}: participants must be 1 or more, got 0"),
    ("passes = 2.5\n", "{config}: passes must be a whole number (1 or more), got 2.5"),
    ("mode = 'later'\n", '{config}: mode must be one of sync, async, got "later"'),
    ("passes = \n", "--config is not TOML: {config}: "),
])
def test_a_file_with_an_unknown_key_or_a_bad_value_is_refused(text: str, expected: str, tmp_path: Path) -> None:
    config = tmp_path / "session.toml"
    config.write_text(text)
    with pytest.raises(SettingError) as refused:
        read_settings(build_parser().parse_args(["serve", "--config", str(config)]), "serve")
    assert str(refused.value).startswith(expected.format(config=config))


def test_serve_and_simulate_exit_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "session.toml"
    config.write_text("join_rate = 5.0\n")  # a relay setting simulate does not take
    assert cli.main(["simulate", "--config", str(config), "--out", str(tmp_path)]) == 2
    assert f"{config}: join_rate is not a setting of simulate (another command's)" in capsys.readouterr().err
    config.write_text("colour = 'red'\n")
    assert cli.main(["serve", "--port", "0", "--config", str(config), "--session-dir", str(tmp_path / "s")]) == 2
    assert f"{config}: colour is not a setting" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # refused before anything was written
    assert cli.main(["serve", "--port", "0", "--config", str(tmp_path / "nowhere.toml")]) == 2
    assert "--config cannot be read" in capsys.readouterr().err


# -- the compatibility rules on every entry point -------------------------------------------------------------------

@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    return build_small_package(tmp_path_factory.mktemp("majority") / "package")


def test_resolve_refuses_conflicts_and_turns_off_what_cannot_apply(package: Package) -> None:
    sync, asynchronous = SessionConfig(participants=2), SessionConfig(participants=2, mode="async")
    options = RelayOptions(admin_token="t")
    assert resolve(sync, options, package).options is options and resolve(sync, options, package).notes == ()
    with pytest.raises(ValueError, match="--round-deadline belongs to synchronous rounds; not with --mode async"):
        resolve(asynchronous, RelayOptions(admin_token="t", round_deadline=5.0), package)
    resolved = resolve(asynchronous, options, package)
    assert resolved.options.verify is True and resolved.options is options  # (host replays judge async results too)
    assert resolved.notes[0].startswith("async mode: host replays judge results against the version")
    copies = resolve(asynchronous, RelayOptions(admin_token="t", redundancy=0.5, verify=False), package)
    assert copies.options.redundancy == 0.5 and copies.notes[0].startswith("async mode: second copies judge results")
    with pytest.raises(SettingError, match="redundancy must be a share between 0 and 1, got 2"):
        resolve(sync, RelayOptions(admin_token="t", redundancy=2.0), package)


def serve_args(package: Package, session_dir: Path, *more: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--port", "0", "--package", str(package.path), "--session-dir",
                                      str(session_dir), "--admin-token", ADMIN_TOKEN, *more])


def test_serve_applies_the_rules(package: Package, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli.serve import open_session

    session_dir = tmp_path / "refused"
    assert cli.main(["serve", "--port", "0", "--package", str(package.path), "--session-dir", str(session_dir),
                     "--mode", "async", "-k", "2", "--round-deadline", "5"]) == 2
    assert "--round-deadline belongs to synchronous rounds; not with --mode async" in capsys.readouterr().err
    assert not (session_dir / "session.json").exists()
    relay = open_session(serve_args(package, tmp_path / "async", "--mode", "async", "--buffer", "2"))
    try:
        assert relay.options.verify is True and relay.session.config.participants == 2
        assert "async mode: host replays" in capsys.readouterr().out
    finally:
        relay.close()
    with pytest.raises(SettingError, match="--buffer is async mode's results per merge"):
        open_session(serve_args(package, tmp_path / "sync", "--buffer", "2"))


def test_simulate_applies_the_rules(package: Package, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--package", str(package.path), "--out", str(tmp_path), "--no-progress", "-k", "2"]
    assert cli.main([*base, "--peer-speeds", "equal", "--mode", "async", "--round-deadline", "5"]) == 2
    assert "--round-deadline belongs to synchronous rounds; not with --mode async" in capsys.readouterr().err
    assert cli.main([*base, "--lease-seconds", "60"]) == 2
    assert "--lease-seconds only apply with --peer-speeds" in capsys.readouterr().err
    config = tmp_path / "async.toml"
    config.write_text('mode = "async"\n')
    assert cli.main([*base, "--config", str(config)]) == 2  # async mode is the simulated relay's
    assert "--mode only apply with --peer-speeds" in capsys.readouterr().err
    assert cli.main([*base, "--buffer", "2", "--peer-speeds", "equal"]) == 2
    assert "--buffer is async mode's results per merge: only with --mode async" in capsys.readouterr().err


def test_the_admin_api_checks_a_value_as_a_flag_and_a_file_do(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=1)
    with serving(relay) as client:
        response = client.post("/api/admin/session", headers=ADMIN,
                               content=json.dumps({"divergence_factor": 1, "replace": True}))
        assert response.status_code == 422
        assert response.json() == {"error": "bad_session", "message": "divergence_factor must be above 1, got 1"}
        assert not (tmp_path / "session" / "archive").exists()


def test_the_admin_api_applies_the_rules(package: Package, tmp_path: Path) -> None:
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, round_deadline=5.0)
    with serving(relay) as client:
        response = client.post("/api/admin/session", headers=ADMIN, content=json.dumps({"mode": "async",
                                                                                        "replace": True}))
        assert (response.status_code, response.json().get("error")) == (422, "bad_session"), response.json()
        assert "--round-deadline belongs to synchronous rounds; not with --mode async" in response.json()["message"]
        assert relay.session.config.mode == "sync" and not (tmp_path / "session" / "archive").exists()
