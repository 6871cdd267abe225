"""Sweeps of simulated sessions (``server.simulation.sweep``): in-process, on a process pool and on Ray, the same bits.

Two merge settings on the small majority package run on every engine; the histories (all but the wall-clock
fields) and the final and best weights must match bit for bit, the session folders written on the driver must
restore, and a session that fails in a worker must come back as an error naming it.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import EXAMPLE, SMALL_SETTINGS, build_small_package

from server import cli
from server.session import checkpoint_files as checkpoint
from server.session.package import Package, build_package
from server.session.session import Session, SessionConfig
from server.simulation.sweep import SessionOutcome, SessionSpec, SweepError, run_sessions
from server.simulation.sweep_ray import check_reachable

WALL_CLOCK = ("time", "seconds")
FAILING_TASK = f'''
import importlib.util
import sys

_spec = importlib.util.spec_from_file_location("sweep_test_majority", {str(EXAMPLE)!r})
_module = sys.modules["sweep_test_majority"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)


class FailingTask(_module.MajorityTask):
    name = "failing"

    def train_unit(self, weights, unit):
        raise RuntimeError("this unit refuses to train")
'''


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    return build_small_package(tmp_path_factory.mktemp("sweep") / "package")


@pytest.fixture(scope="module")
def failing_package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    folder = tmp_path_factory.mktemp("failing")
    (folder / "failing_task.py").write_text(FAILING_TASK)
    return build_package(str(folder / "failing_task.py"), dict(SMALL_SETTINGS), folder / "package", check=False,
                         log=lambda _: None)


def specs_for(package: Package | Path) -> list[SessionSpec]:
    """FedAvg and FedAvgM (k=2 of 4 chunks, 2 passes: 4 rounds each)."""
    return [SessionSpec(package, SessionConfig(merge=merge, merge_config=config, participants=2, passes=2,
                                               force=True, label=label), label)
            for merge, config, label in (("fedavg", {}, "fedavg"), ("fedavgm", {"server_momentum": 0.9}, "fedavgm"))]


def without_wall_clock(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in entry.items() if k not in WALL_CLOCK} for entry in history]


def sha(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


@pytest.fixture(scope="module")
def reference(package: Package, tmp_path_factory: pytest.TempPathFactory) -> list[SessionOutcome]:
    """The sweep in this process, one session after another (what the simulator always did), here with two BLAS
    threads around it: the sessions still train with one, as in every worker (OpenBLAS's float32 matmuls differ in
    the last bits between 1 and 2 threads)."""
    from threadpoolctl import threadpool_limits

    started = time.perf_counter()
    with threadpool_limits(limits=2):
        outcomes = run_sessions(specs_for(package), engine="local", out=tmp_path_factory.mktemp("local"),
                                progress=False)
    print(f"in-process: {time.perf_counter() - started:.2f} s")
    return outcomes


def assert_same_bits(outcomes: list[SessionOutcome], reference: list[SessionOutcome], package: Package) -> None:
    assert [o.name for o in outcomes] == [r.name for r in reference] == ["fedavg", "fedavgm"]
    for outcome, expected in zip(outcomes, reference, strict=True):
        assert len(outcome.history) == 4
        assert without_wall_clock(outcome.history) == without_wall_clock(expected.history)
        assert sha(outcome.weights) == sha(expected.weights) and outcome.weights.dtype == np.float32
        assert sha(outcome.best_weights) == sha(expected.best_weights)
        assert (outcome.best_metric, outcome.best_round, outcome.stopped) == \
            (expected.best_metric, expected.best_round, expected.stopped)
        assert outcome.describe() == expected.describe()
        # The folder written on the driver restores, names this machine's package, holds the same weights.
        assert outcome.directory is not None and outcome.session is not None
        restored = Session.restore(outcome.directory)
        assert checkpoint.read_session_config(outcome.directory)["package"] == str(Path(package.path).resolve())
        assert restored.round == 4 and sha(restored.weights) == sha(expected.weights)
        assert outcome.session.describe() == restored.describe() == expected.describe()
        assert sha(restored.best_weights) == sha(expected.best_weights)
        assert without_wall_clock(restored.history) == without_wall_clock(expected.history)
    assert sha(reference[0].weights) != sha(reference[1].weights)  # (the two settings do differ)


def test_a_pool_gives_the_bits_of_in_process_runs(package: Package, reference: list[SessionOutcome],
                                                  tmp_path: Path) -> None:
    started = time.perf_counter()
    outcomes = run_sessions(specs_for(Path(package.path)), engine="pool", workers=2, out=tmp_path, progress=False)
    print(f"pool of 2: {time.perf_counter() - started:.2f} s")
    assert_same_bits(outcomes, reference, package)


def test_a_failing_session_is_named_in_process_and_on_a_pool(package: Package, failing_package: Package,
                                                             tmp_path: Path) -> None:
    specs = [specs_for(package)[0], SessionSpec(failing_package, SessionConfig(participants=2, passes=2,
                                                                               label="doomed"), "doomed")]
    for engine in ("local", "pool"):
        started = time.perf_counter()
        with pytest.raises(SweepError, match="session 'doomed' failed: RuntimeError: this unit refuses to train") \
                as caught:
            run_sessions(specs, engine=engine, workers=2, out=tmp_path / engine, progress=False)  # type: ignore[arg-type]
        assert caught.value.label == "doomed"
        assert time.perf_counter() - started < 60
    assert caught.value.worker_traceback is not None and "train_unit" in caught.value.worker_traceback


def test_configs_are_checked_before_any_worker_starts(package: Package, tmp_path: Path) -> None:
    bad = SessionSpec(package, SessionConfig(participants=2, passes=2, aggregate="krum", aggregate_config={"f": 1}),
                      "krum")
    with pytest.raises(Exception, match="needs more than 4 results a round"):
        run_sessions([specs_for(package)[0], bad], engine="pool", workers=2, out=tmp_path, progress=False)
    assert not (tmp_path / "fedavg").exists()
    with pytest.raises(SweepError, match="share a folder name"):
        run_sessions(specs_for(package) * 2, engine="local", progress=False)


def test_ray_missing_or_unreachable_is_one_clear_line(package: Package, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SweepError, match="cannot reach the Ray cluster at 127.0.0.1:9"):
        check_reachable("127.0.0.1:9", timeout=2)
    with pytest.raises(SweepError, match="expected HOST:PORT"):
        check_reachable("nowhere")
    args = ["simulate", "--package", str(package.path), "-k", "2", "--passes", "2", "--no-progress",
            "--out", str(tmp_path), "--ray", "127.0.0.1:9"]
    assert cli.main(args) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("peertrain simulate: cannot reach the Ray cluster at 127.0.0.1:9") and "\n" not in error
    monkeypatch.setitem(sys.modules, "ray", None)  # (import ray raises ImportError)
    assert cli.main(args[:-1]) == 2
    assert "--ray needs Ray: pip install" in capsys.readouterr().err


def test_simulate_workers_give_the_same_table(package: Package, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    common = ["simulate", "--package", str(package.path), "--merge", "fedavg,fedavgm", "--force", "-k", "2",
              "--passes", "2", "--no-progress"]
    assert cli.main(common + ["--workers", "1", "--out", str(tmp_path / "one")]) == 0
    assert "in-process" in capsys.readouterr().out
    assert cli.main(common + ["--workers", "2", "--out", str(tmp_path / "two")]) == 0
    assert "on a pool of 2 processes" in capsys.readouterr().out
    assert (tmp_path / "one" / "comparison.md").read_text() == (tmp_path / "two" / "comparison.md").read_text()
    assert (tmp_path / "two" / "comparison.png").is_file()
    assert cli.main(common + ["--workers", "2", "--peer-speeds", "equal", "--out", str(tmp_path / "x")]) == 2
    assert "do not apply with --peer-speeds" in capsys.readouterr().err


def ray_processes() -> set[int]:
    """Processes of Ray's (its GCS server, raylets, workers) on this machine."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"gcs_server" in command or b"raylet" in command or b"ray::" in command or b"default_worker.py" in command:
            found.add(int(entry.name))
    return found


@pytest.mark.slow
def test_ray_gives_the_bits_of_in_process_runs_and_leaves_nothing_behind(
        package: Package, failing_package: Package, reference: list[SessionOutcome], tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import ray

    before = ray_processes()
    started = time.perf_counter()
    outcomes = run_sessions(specs_for(package), engine="ray", workers=2, out=tmp_path / "ok", progress=False)
    print(f"local Ray, 2 CPUs: {time.perf_counter() - started:.2f} s (Ray's start and shutdown included)")
    assert_same_bits(outcomes, reference, package)
    assert not ray.is_initialized()

    doomed = SessionSpec(failing_package, SessionConfig(participants=2, passes=2, label="doomed"), "doomed")
    with pytest.raises(SweepError, match="session 'doomed' failed: RuntimeError: this unit refuses to train"):
        run_sessions([doomed, specs_for(package)[1]], engine="ray", workers=2, out=tmp_path / "bad", progress=False)
    assert not ray.is_initialized()
    deadline = time.monotonic() + 15
    while ray_processes() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray_processes() - before == set()
