"""The ``peertrain`` command line: help, honest placeholders, and ``serve`` end to end."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from server import cli
from server.browser.launcher import relay_process
from server.harness.serve_command import ServeCommand
from server.relay.app import RelayPaths

REPO_ROOT = Path(__file__).resolve().parents[3]


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
    with relay_process(ServeCommand(no_session=True), log_path=log_path) as url:
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


BLAS_THREADS_AFTER = """
import json, sys
from server import cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
import numpy
from threadpoolctl import threadpool_info
print(json.dumps(max(pool["num_threads"] for pool in threadpool_info())))
"""


def blas_threads_after(*words: str) -> int:
    """How many threads BLAS runs with in a fresh process that ran ``peertrain WORDS`` (numpy imported after)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", BLAS_THREADS_AFTER, *words], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    return int(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_relay_runs_numpy_on_one_blas_thread_unless_the_user_chose_otherwise() -> None:
    """The relay reads results in threads of its own: OpenBLAS's threads on top only oversubscribe the cores (a
    float64 norm took 2.4 ms of CPU with two threads on a busy host, 0.05 ms with one)."""
    assert blas_threads_after("serve", "--help") == 1
    assert blas_threads_after("verify-worker", "--help") == 1
    if (os.cpu_count() or 1) > 1:  # (the control: a command that keeps OpenBLAS's default)
        assert blas_threads_after("package", "--help") > 1


def test_serve_refuses_without_setup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli.commands import build_parser
    from server.cli.serve import run as serve

    args = build_parser().parse_args(["serve", "--port", "0", "--no-session"])
    assert serve(args, paths=RelayPaths(web=tmp_path, wheels=tmp_path)) == 2
    assert "make setup" in capsys.readouterr().err


def command_parser(name: str) -> argparse.ArgumentParser:
    from server.cli import serve, simulate

    parser = argparse.ArgumentParser(prog=f"peertrain {name}")
    {"serve": serve, "simulate": simulate}[name].add_arguments(parser)
    return parser


def test_a_setting_both_commands_take_has_one_flag_default_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    """The flags come from the declarations (server.session.settings): where serve and simulate share a setting,
    its flags and help are the same words; the one default that differs is declared with its reason."""
    from server.relay.options import RelayOptions
    from server.session.config import SessionConfig
    from server.session.settings import declared

    actions: dict[str, dict[str, argparse.Action]] = {"serve": {}, "simulate": {}}
    for name, found in actions.items():
        for action in command_parser(name)._actions:
            found.setdefault(action.dest, action)  # (the setting's own flag; --no-backups comes after it)
    shared = 0
    for cls in (SessionConfig, RelayOptions):
        for name, item in declared(cls).items():
            for command in item.setting.commands:
                assert item.flag in actions[command][name].option_strings, (command, name)
            if set(item.setting.commands) >= {"serve", "simulate"}:
                shared += 1
                serve, simulate = actions["serve"][name], actions["simulate"][name]
                assert serve.option_strings == simulate.option_strings, name
                if item.setting.command_defaults:  # a default of its own, declared with the reason
                    assert all(len(why) > 20 for _, why in item.setting.command_defaults.values()), name
                    assert serve.help.partition(" (default")[0] == simulate.help.partition(" (default")[0], name
                else:
                    assert serve.help == simulate.help, name
    assert shared >= 15
    assert list(declared(SessionConfig)["participants"].setting.command_defaults) == ["serve"]
    for name in ("serve", "simulate"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([name, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert "--config FILE" in text and "-k K, --participants K" in text and "--max-rounds N, --rounds N" in text


def test_serve_on_a_database_that_holds_another_session_refuses_and_fresh_drops_it(
        tmp_path: Path, postgresql_url: str, majority_importable: None, capsys: pytest.CaptureFixture[str]) -> None:
    """``serve --store postgresql://...``: one database holds one session. A new session folder over a database that
    holds another session's rows is refused (exit 2, nothing written to the database); ``--fresh`` drops the
    tables and starts over; the folder that has the session resumes it."""
    from relay_fixtures import build_small_package

    from server.cli.commands import build_parser
    from server.cli.serve import open_session
    from server.cli.serve import run as serve
    from server.relay.store import StoreInUse, open_store
    from server.relay.store.postgresql.store import SessionHold

    package = build_small_package(tmp_path / "package", task="majority_task:MajorityTask")

    def arguments(folder: str, *more: str) -> argparse.Namespace:
        return build_parser().parse_args(["serve", "--port", "0", "--package", str(package.path), "--session-dir",
                                          str(tmp_path / folder), "--store", postgresql_url, *more])

    relay = open_session(arguments("first"))
    peer_id, _ = relay.store.add_peer("agent", "127.0.0.1")
    relay.store.count("results_accepted")
    relay.store.close()

    with pytest.raises(StoreInUse, match="holds another session's state"):
        open_session(arguments("second"))
    assert serve(arguments("second"), paths=RelayPaths()) == 2
    assert "holds another session's state" in capsys.readouterr().err
    # The refused serve let the session's hold go, and its watch on the hold ended (a watch left behind would stop
    # this process once the database goes)
    hold = SessionHold(postgresql_url)
    try:
        assert hold.take()
    finally:
        hold.close()
    for watch in [thread for thread in threading.enumerate() if thread.name == "session-hold"]:
        watch.join(timeout=10)  # (it ends at its next look, within a second of the hold's close)
    assert not any(thread.name == "session-hold" for thread in threading.enumerate())
    kept = open_store(postgresql_url)
    try:
        assert kept.peers_listing()[0]["peer_id"] == peer_id and kept.counters() == {"results_accepted": 1}
    finally:
        kept.close()

    resumed = open_session(arguments("first"))  # (its folder has the session: resumed, rows kept)
    try:
        assert resumed.store.peer_count() == 1 and "resuming session" in capsys.readouterr().out
    finally:
        resumed.store.close()

    fresh = open_session(arguments("second", "--fresh"))
    try:
        assert fresh.store.peer_count() == 0 and fresh.store.counters() == {} and fresh.session.round == 0
        assert not (tmp_path / "second" / "relay.sqlite3").exists()
    finally:
        fresh.store.close()


def test_serve_warns_that_a_task_module_from_the_python_path_reaches_no_browser(
        tmp_path: Path, majority_importable: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A task given as a module outside the runtime (``majority_task:MajorityTask``, importable here) has no file to
    build a wheel of: ``serve`` says browsers cannot import it, that the host replays it natively (Pyodide cannot
    import it either), and how to fix it. A task of the runtime's says nothing of the kind."""
    from relay_fixtures import build_small_package

    from server.cli.commands import build_parser
    from server.cli.serve import open_session, unserved_task_note

    package = build_small_package(tmp_path / "package", task="majority_task:MajorityTask")
    arguments = build_parser().parse_args(["serve", "--port", "0", "--package", str(package.path), "--session-dir",
                                           str(tmp_path / "session")])
    open_session(arguments).store.close()
    out = capsys.readouterr().out
    assert "warning: the task module majority_task comes from this machine's Python path" in out, out
    assert "--task path/to/majority_task.py" in out
    assert "the host replays its results natively instead of on the browser's engine" in out, out  # (auto)
    assert "replays of results fail to run" in str(unserved_task_note({"task_import": "majority_task:M"}, "pyodide"))
    assert unserved_task_note({"task_import": "runtime.tasks.arith:ArithTask", "task_source": None}) is None
    assert unserved_task_note({"task_import": "majority_task:MajorityTask", "task_source": "/x/majority_task.py"}) \
        is None


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
def test_serve_stopped_by_sigterm_stops_its_headless_peers(tmp_path: Path) -> None:
    """uvicorn re-raises the SIGTERM it shut down on: serve must still leave through its own clean-up, so the
    `--peers` process (and its Chromium) does not outlive the relay; the exit code is a shell's for SIGTERM."""
    import time

    from server.harness.relay_process import RelayProcess

    def children(pid: int) -> list[int]:
        path = Path(f"/proc/{pid}/task/{pid}/children")
        return [int(child) for child in path.read_text().split()] if path.exists() else []

    with RelayProcess(ServeCommand(no_session=True, peers=1), log=tmp_path / "serve.log") as relay:
        assert relay.process is not None
        deadline = time.monotonic() + 60
        while not children(relay.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        (peers,) = children(relay.process.pid)
        code = relay.stop()
    assert code == 143, relay.logs[-2000:]

    def alive(pid: int) -> bool:
        """Running, not a zombie init has yet to reap (gone between two reads counts as gone)."""
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 30  # (polling another process's state: bounded, no event to wait on)
    while alive(peers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(peers)
