"""``server.harness.serve_command.ServeCommand``: serve's arguments as objects, read back by serve's own parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from server.cli.options import parse_sets, read_limits, read_settings
from server.cli.serve import add_arguments
from server.harness.serve_command import ServeCommand, set_text
from server.relay.options import RelayOptions, ServerLimits
from server.session.config import SessionConfig


def parsed(arguments: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(arguments)


def test_serve_reads_back_every_part_of_the_command(tmp_path: Path) -> None:
    config = SessionConfig(participants=2, passes=4, mode="async", codec="int8")
    options = RelayOptions(admin_token="t", backup_after=None, keep_results=None)
    limits = ServerLimits(body_timeout=2.5, max_body_bytes=10**6)
    settings = {"units": 2, "tokenizer": "char", "lr": 0.03, "flag": True, "name": "3", "items": [1, 2],
                "path": str(tmp_path / "a b.csv")}
    command = ServeCommand(task="arith", task_settings=settings, package=tmp_path / "package",
                           session_dir=tmp_path / "session", config=config, options=options, limits=limits, fresh=True,
                           force_verify=True, port=8123, peers=2, tls_cert=tmp_path / "cert.pem",
                           tls_key=tmp_path / "key.pem",
                           config_file=tmp_path / "session.toml", tensorboard=tmp_path / "tb", mlflow="local",
                           extra=("--log-level", "info"))
    args = parsed(command.arguments())
    assert (args.tensorboard, args.mlflow) == (tmp_path / "tb", "local")
    assert (args.task, args.package, args.session_dir, args.tls_cert, args.tls_key, args.config) == (
        "arith", tmp_path / "package", tmp_path / "session", tmp_path / "cert.pem", tmp_path / "key.pem",
        tmp_path / "session.toml")
    assert args.fresh and args.force_verify and not args.no_session and args.log_level == "info"
    assert (args.port, args.peers) == (8123, 2)
    assert parse_sets(args.sets) == settings  # (the text "3" stays text, True a boolean)
    args.config = None  # (the file does not exist: its reading is test_settings.py's)
    session, relay = read_settings(args, "serve", environ={})
    assert (SessionConfig(**session), RelayOptions(**relay), read_limits(args)) == (config, options, limits)


def test_no_objects_no_flags() -> None:
    assert ServeCommand().arguments() == []
    assert ServeCommand(no_session=True).arguments() == ["--no-session"]


@pytest.mark.parametrize("value", ["char", "3", "true", "null", '"quoted"', "[1", 7, 0.1, False, None, {"a": [1]}])
def test_a_task_setting_reads_back_as_itself(value: object) -> None:
    assert parse_sets([f"key={set_text(value)}"]) == {"key": value}
