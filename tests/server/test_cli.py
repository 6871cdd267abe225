"""The ``peertrain`` command line: help, honest placeholders, and ``serve`` end to end."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from server import cli
from server.browser.launcher import relay_process
from server.relay.app import RelayPaths

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for command in ("serve", "peers", "simulate", "package", "bench"):
        assert command in text


def test_a_bench_not_built_yet_says_so(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from server import bench

    monkeypatch.setitem(bench.BENCHES, "future", ("server.bench.no_such_module",))
    assert cli.main(["bench", "future"]) == 2
    assert "peertrain bench future: not built yet." in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses names outside the registry
        cli.main(["bench", "nonsense"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err


@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
def test_serve_prints_url_and_serves(tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    with relay_process("--no-session", log_path=log_path) as url:
        assert url.startswith("http://127.0.0.1:")
        assert f"Open {url} in a browser to join." in log_path.read_text()
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/").status_code == 200
            assert client.get("/healthz").json()["ok"] is True
            wasm = client.get("/pyodide/pyodide.asm.wasm")
            assert wasm.headers["content-type"] == "application/wasm"
            assert wasm.content[:4] == b"\0asm"
            lock = client.get("/pyodide/pyodide-lock.json").json()
            wheel = lock["packages"]["peertrain-runtime"]["file_name"]
            assert client.get(f"/wheels/{wheel}").content[:2] == b"PK"
            assert client.get("/../pyproject.toml").status_code == 404


def test_serve_refuses_without_setup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli.commands import build_parser
    from server.cli.serve import run as serve

    args = build_parser().parse_args(["serve", "--port", "0", "--no-session"])
    assert serve(args, paths=RelayPaths(web=tmp_path, wheels=tmp_path)) == 2
    assert "make setup" in capsys.readouterr().err
