"""``server.harness`` against a real ``peertrain serve``: the relay process (start, URL, admin token, SIGKILL,
restart on the same port, stop) and native peers whose hooks change the upload or skip the training."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from relay_fixtures import EXAMPLE, SMALL_SETTINGS

from runtime import wire
from server.harness.native_peer import Job, NativePeer, PeerHooks
from server.harness.relay_process import RelayProcess
from server.harness.serve_command import ServeCommand
from server.relay.app import RelayPaths
from server.relay.options import RelayOptions
from server.relay.peer_endpoints import RESULT_REFUSALS
from server.session.config import SessionConfig
from server.session.export import exported_weights

pytestmark = pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built node_modules and wheels")


@pytest.fixture(autouse=True)
def majority_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))  # the peers import majority_task as the relay does


def majority(session_dir: Path, admin_token: str = "") -> ServeCommand:
    """The majority example (4 units, 2 a round, one pass: 2 rounds), one peer enough, no host replays; an empty
    admin token: serve makes one up and prints it."""
    return ServeCommand(task="majority_task:MajorityTask", task_settings=SMALL_SETTINGS, session_dir=session_dir,
                        config=SessionConfig(participants=2, passes=1),
                        options=RelayOptions(admin_token=admin_token, min_peers=1, verify=False))


def test_start_url_token_kill_restart_and_stop_of_a_real_relay(tmp_path: Path) -> None:
    relay = RelayProcess(majority(tmp_path / "session"), log=tmp_path / "serve.log", examples=True)
    with relay:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", relay.url) and relay.page_url == relay.url + "/"
        first_url, first_pid = relay.url, relay.pid
        assert relay.client().status()["round"] == 0
        assert relay.admin_token  # printed by serve, which made it up
        peers = httpx.get(relay.url + "/api/admin/peers", headers=relay.admin_headers(), timeout=10)
        assert peers.status_code == 200, peers.text

        assert relay.kill() == -9 and not relay.running
        with pytest.raises(httpx.TransportError):
            httpx.get(relay.url + "/healthz", timeout=5)

        relay.start()  # the same port, the same session folder
        assert relay.url == first_url and relay.pid != first_pid and relay.starts == 2
        assert "resuming session" in relay.logs and relay.logs.count("peertrain relay listening") == 2
        again = httpx.get(relay.url + "/api/admin/peers", headers=relay.admin_headers(), timeout=10)
        assert again.status_code == 200  # the token the second start printed

        relay.restart()
        assert relay.url == first_url and relay.starts == 3 and relay.running
    assert not relay.running and relay.process is not None and relay.process.returncode not in (None, -9)


def test_a_peer_whose_hook_changes_the_upload_is_refused_with_the_documented_code(tmp_path: Path) -> None:
    def claim_everything(job: Job, honest: bytes) -> bytes:
        header, vector = wire.decode(honest)
        return wire.encode(vector, dataclasses.replace(header, num_examples=10**6))  # a unit holds 256

    with RelayProcess(majority(tmp_path / "session", "t"), log=tmp_path / "serve.log",
                      examples=True) as relay:
        assert relay.admin_token == "t"
        hooks = PeerHooks(upload=claim_everything)
        peer = NativePeer(relay.url, hooks=hooks, timeout_s=120)
        hooks.stop = lambda: bool(peer.log.refusals)
        assert peer.run() == "stopped"
        peer.close()
        status = relay.client().status()
    assert peer.log.refusals == [(422, "num_examples_claim")] and (422, "num_examples_claim") in RESULT_REFUSALS
    assert peer.log.trained == 1 and peer.log.results == {"422 num_examples_claim": 1} and not peer.log.accepted
    assert status["round"] == 0 and status["counters"].get("results_accepted", 0) == 0, status["counters"]


def test_a_peer_whose_hook_skips_training_uploads_the_given_bytes(tmp_path: Path) -> None:
    seen: list[bytes] = []

    def unchanged_weights(job: Job, weights: bytes) -> bytes:
        """A free rider's result: the global weights as they came, claiming one example."""
        seen.append(weights)
        header, vector = wire.decode(weights)
        return wire.encode(vector, dataclasses.replace(header, round=job.round, num_examples=1,
                                                       metrics={"loss": 1.0}))

    with RelayProcess(majority(tmp_path / "session", "t"), log=tmp_path / "serve.log",
                      examples=True) as relay:
        peer = NativePeer(relay.url, hooks=PeerHooks(train=unchanged_weights), timeout_s=120)
        assert peer.run() == "done"
        peer.close()
        status = relay.client().status()
        model = httpx.get(relay.url + "/api/admin/export/model", headers=relay.admin_headers(), timeout=30)
    assert status["done"] and status["round"] == 2
    assert peer.log.trained == 0 and peer.peer is None  # no task built, no unit trained
    assert peer.log.uploads_skipped_training == len(peer.log.accepted) == 4
    assert sorted(peer.log.accepted) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # Every update was zero: the merged model is the initial one, bit for bit.
    np.testing.assert_array_equal(exported_weights(model.content), wire.decode(seen[0])[1])


def test_a_task_module_from_the_python_path_is_replayed_natively_and_its_results_verified(tmp_path: Path) -> None:
    """``--replay-engine auto`` where Pyodide runs but cannot import the task (a module from this machine's Python
    path, no wheel of it): the relay replays natively, so every replay runs and judges its result, where each used to
    fail on the host (Pyodide workers booted for nothing) and leave the result unchecked."""
    command = majority(tmp_path / "session", "t")
    command = dataclasses.replace(command, options=dataclasses.replace(command.options, verify=True,
                                                                       verify_fraction=1.0))
    with RelayProcess(command, log=tmp_path / "serve.log", examples=True) as relay:
        peer = NativePeer(relay.url, timeout_s=120)
        assert peer.run() == "done"
        peer.close()
        status = relay.client().status()
        logs = relay.logs
    counters = status["counters"]
    assert counters.get("results_verified") == 4 and "replays_failed_on_host" not in counters, counters
    assert "verification_failed" not in counters and "peers_banned" not in counters, counters
    assert "the host replays its results natively instead of on the browser's engine" in logs, logs[-3000:]
