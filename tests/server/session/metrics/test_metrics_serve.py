"""``serve --tensorboard DIR --mlflow``: a real relay, a native peer to the end, then each round of the relay's
``history.jsonl`` in both tools (the relay writes them; the peer only sends its results), the run FINISHED."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from metrics_readers import (
    assert_float32_equal,
    expected_series,
    history,
    mlflow_run,
    mlflow_series,
    tensorboard_series,
)
from relay_fixtures import EXAMPLE, SMALL_SETTINGS

from server.harness.native_peer import NativePeer
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.app import RelayPaths
from server.relay.options import RelayOptions
from server.session.config import SessionConfig
from server.session.metrics import LOCAL_STORE

pytestmark = pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built node_modules and wheels")


def test_serve_writes_the_relays_rounds_to_tensorboard_and_mlflow(tmp_path: Path, mlflow_store: Callable[[Path], str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # the peer imports majority_task as the relay does
    session_dir, tensorboard = tmp_path / "session", tmp_path / "tensorboard"
    tracking_uri = mlflow_store(session_dir)  # (where --mlflow without a URI puts its store)
    serve = ServeCommand(task="majority_task:MajorityTask", task_settings=SMALL_SETTINGS, session_dir=session_dir,
                         config=SessionConfig(participants=2, passes=1),
                         options=RelayOptions(admin_token="t", min_peers=1, verify=False),
                         tensorboard=tensorboard, mlflow=LOCAL_STORE)
    with RelayProcess(serve, log=tmp_path / "serve.log", examples=True) as relay:
        peer = NativePeer(relay.url, timeout_s=120)
        assert peer.run() == "done"
        peer.close()
    # (stopped: the relay's metrics log has written everything and ended the run)
    expected = expected_series(history(session_dir))
    assert [step for step, _ in expected["metrics/accuracy"]] == [0, 1]
    assert_float32_equal(tensorboard_series(tensorboard / "session"), expected)
    run = mlflow_run(tracking_uri, "session")
    assert run.info.status == "FINISHED" and run.data.params["config/participants"] == "2"
    assert mlflow_series(tracking_uri, run.info.run_id) == expected
