"""Local tasks on the relay and in the round loop: peers train on their own files (the CSV example), only weights and
held-out metrics come back. Units are never replayed or copied for comparison, a result's count is the peer's up to
the task's cap, federated evaluation reaches the history, and a session without host validation is judged by it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from relay_fixtures import ADMIN_TOKEN, HttpPeer, make_relay, serving, session_status, wait_for_round

from runtime import wire
from runtime.tasks import UnitResult
from server import cli
from server.relay.app import RelayPaths
from server.relay.checks import LOCAL_NOT_COVERED
from server.session.package import Package, build_package
from server.session.session import Session, SessionConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
CSV_TASK = REPO_ROOT / "examples" / "csv_task.py"
DATA = REPO_ROOT / "examples" / "data" / "csv"
PEER_FILES = [DATA / "peers" / f"peer-{n}" / "rows.csv" for n in (1, 2, 3)]
SETTINGS: dict[str, Any] = {"units": 3, "epochs": 2}


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Package:
    """The CSV task with the host's own validation file."""
    return build_package(str(CSV_TASK), SETTINGS | {"validation_file": str(DATA / "validation.csv")},
                         tmp_path_factory.mktemp("hosted") / "package", log=lambda _: None)


@pytest.fixture(scope="module")
def federated_only(tmp_path_factory: pytest.TempPathFactory) -> Package:
    """The CSV task without a validation split: judged by federated evaluation."""
    return build_package(str(CSV_TASK), SETTINGS, tmp_path_factory.mktemp("federated") / "package",
                         log=lambda _: None)


class LocalPeer(HttpPeer):
    """A native peer holding one CSV file of its own, as a page after its person chose the file."""

    def __init__(self, client: httpx.Client, path: Path) -> None:
        super().__init__(client)
        assert self.peer.local is not None
        self.peer.local.add(path.name, path.read_bytes())


def trained_locally(package: Package, weights: np.ndarray, path: Path, job: dict[str, Any]) -> UnitResult:
    """The unit a peer holding ``path`` trains for ``job`` (what the simulator computes)."""
    from runtime.tasks.local import LocalData, train_local_unit

    local = LocalData(package.task)
    local.add(path.name, path.read_bytes())
    return train_local_unit(package.task, weights, local.work_unit(job["unit_index"], job["unit_seed"]))


def test_local_units_carry_no_data_are_never_replayed_and_report_federated_metrics(hosted: Package,
                                                                                   tmp_path: Path) -> None:
    relay = make_relay(hosted, tmp_path / "session", k=3, passes=1, verify=True, verify_fraction=1.0)
    with serving(relay) as client:
        peers = [LocalPeer(client, path) for path in PEER_FILES]
        status = session_status(client)
        assert status["task"]["kind"] == "local" and status["evaluation"] == "host"
        assert status["task"]["local"]["max_examples_per_unit"] == 5000
        assert LOCAL_NOT_COVERED in status["defenses"]["not_covered"]
        assert not any("re-trained on the host" in guard for guard in status["defenses"]["guards"])
        jobs = [peer.assignment() for peer in peers]
        assert {job["kind"] for job in jobs} == {"local"}
        refused = peers[0].client.get(f"/api/unit/{jobs[0]['unit_index']}", headers=peers[0].headers)
        assert refused.status_code == 403 and refused.json()["error"] == "not_leased"
        weights = relay.session.weights.copy()
        messages = [peer.train(job) for peer, job in zip(peers, jobs, strict=True)]
        for peer, job, message in zip(peers, jobs, messages, strict=True):
            assert peer.upload(job["round"], job["slot"], message).status_code == 200
        status = wait_for_round(client, 1)
    entry = status["history"][0]
    # the relay counts each peer's own examples (320 of its 400 rows train, 80 are held out), never a chunk's
    assert entry["examples"] == 3 * 320 and entry["participants"] == 3
    assert set(entry["train"]) == {"train_loss", "seconds"}  # federated metrics are not training metrics
    federated = entry["federated"]
    assert federated["of_round"] == 0 and federated["examples"] == 3 * 80 and federated["results"] == 3
    expected = [trained_locally(hosted, weights, path, job).metrics for path, job in zip(PEER_FILES, jobs, strict=True)]
    assert federated["metrics"]["accuracy"] == pytest.approx(np.mean([m["federated_accuracy"] for m in expected]))
    assert entry["metrics"]["accuracy"] > status["initial_metrics"]["accuracy"]  # the host's own validation
    assert "replays_queued" not in status["counters"] and "results_verified" not in status["counters"]
    assert status["done"]


def test_a_claim_above_the_cap_is_refused(hosted: Package, tmp_path: Path) -> None:
    relay = make_relay(hosted, tmp_path / "session", k=1, passes=1)
    with serving(relay) as client:
        peer = LocalPeer(client, PEER_FILES[0])
        job = peer.assignment()
        header, vector = wire.decode(peer.train(job))
        response = peer.upload(job["round"], job["slot"], wire.encode(vector, replace(header, num_examples=5001)))
    assert response.status_code == 422 and response.json()["error"] == "num_examples_claim"
    assert "trains on at most 5000 examples; the result claims 5001" in response.json()["message"]


def test_a_volunteers_files_count_once_a_round_while_another_volunteer_could_train(hosted: Package,
                                                                                  tmp_path: Path) -> None:
    """Three pages, three units a round: a page whose files trained a unit waits while another page's have not
    counted (one waiting, one training), and takes the last unit once nobody else is connected."""
    relay = make_relay(hosted, tmp_path / "session", k=3, passes=1)
    with serving(relay) as client:
        first, second, third = (LocalPeer(client, path) for path in PEER_FILES)
        job = first.assignment()
        assert first.train_and_upload(job).status_code == 200
        again = first.work()
        assert "slot" not in again and "your files trained a unit of this round" in again["reason"], again
        held = second.assignment()  # (its files are training: counted; the third's are not)
        assert "your files trained a unit" in first.work()["reason"]
        assert held["slot"] != job["slot"]
        third.leave()  # (nobody else's files could take the round's last unit: the first's train it)
        last = first.assignment()
        assert len({job["slot"], held["slot"], last["slot"]}) == 3
        assert first.train_and_upload(last).status_code == 200
        assert second.train_and_upload(held).status_code == 200
        wait_for_round(client, 1)
        trainers = {r.slot: r.peer_id for r in relay.store.all_results() if r.round == 0}
    assert trainers == {job["slot"]: first.peer_id, held["slot"]: second.peer_id, last["slot"]: first.peer_id}


def test_a_local_units_backup_goes_only_to_a_volunteer_whose_files_the_round_has_not_counted(
        hosted: Package, tmp_path: Path) -> None:
    """Backups at once: the page whose result is in does not race the straggler on its own files again (under load
    in the browser test, such a backup won and one page's files counted twice in a round); a page that joins then
    does."""
    relay = make_relay(hosted, tmp_path / "session", k=2, passes=1, backup_after=0)
    with serving(relay) as client:
        fast, slow = LocalPeer(client, PEER_FILES[0]), LocalPeer(client, PEER_FILES[1])
        done, straggling = fast.assignment(), slow.assignment()
        assert fast.train_and_upload(done).status_code == 200
        idle = fast.work()
        assert "slot" not in idle and "waiting for other peers' units" in idle["reason"], idle
        late = LocalPeer(client, PEER_FILES[2])
        backup = late.assignment()
        assert (backup["slot"], backup["copy"]) == (straggling["slot"], "backup")
        assert late.train_and_upload(backup).status_code == 200
        wait_for_round(client, 1)
        trainers = {r.slot: r.peer_id for r in relay.store.all_results() if r.round == 0}
    assert trainers == {done["slot"]: fast.peer_id, straggling["slot"]: late.peer_id}


def test_a_relay_session_judged_by_federated_evaluation_is_the_native_one(federated_only: Package,
                                                                            tmp_path: Path) -> None:
    relay = make_relay(federated_only, tmp_path / "session", k=3, passes=2)
    assigned: list[dict[int, Path]] = []
    with serving(relay) as client:
        peers = [LocalPeer(client, path) for path in PEER_FILES]
        assert session_status(client)["evaluation"] == "federated"
        assert session_status(client)["initial_metrics"] == {}
        while not session_status(client)["done"]:
            jobs = [(peer, peer.assignment()) for peer in peers]
            assigned.append({job["slot"]: path for (_, job), path in zip(jobs, PEER_FILES, strict=True)})
            for peer, job in jobs:
                assert peer.train_and_upload(job).status_code == 200
            wait_for_round(client, len(assigned))
        final = session_status(client)
    history = final["history"]
    assert [e["federated"]["of_round"] for e in history] == [0, 1] and all(e["metrics"] == {} for e in history)
    # the same units trained in-process, each slot by the peer (file) that trained it over HTTP
    session = Session.create(federated_only, SessionConfig(participants=3, passes=2))
    for mapping in assigned:
        session.complete_round([(a, trained_locally(federated_only, session.weights, mapping[a.slot], a.to_json()))
                                for a in session.assignments()])
    assert np.array_equal(session.weights, relay.session.weights)
    assert [e["federated"] for e in session.history] == [e["federated"] for e in history]
    # the best checkpoint is the global weights with the best federated metric
    losses = [e["federated"]["metrics"]["val_loss"] for e in history]
    assert final["best"]["metric"] == pytest.approx(min(losses))
    assert final["best"]["round"] == (None if losses[0] <= losses[1] else 0)
    assert session.metric_series() == [*losses, None]


def results_reporting(session: Session, loss: float) -> list[tuple[Any, UnitResult]]:
    return [(a, UnitResult(session.weights + 0.01, 10, {"federated_val_loss": loss, "federated_examples": 5}))
            for a in session.assignments()]


@pytest.mark.parametrize("action", ["stop", "rollback"])
def test_federated_divergence_stops_or_rolls_back(federated_only: Package, action: str) -> None:
    session = Session.create(federated_only, SessionConfig(participants=3, passes=3, on_divergence=action))
    start = session.weights.copy()
    session.complete_round(results_reporting(session, 1.0))  # the initial weights: the best so far
    assert session.best_metric == 1.0 and session.best_round is None
    session.complete_round(results_reporting(session, 0.5))  # the weights after round 1 are better
    assert session.best_metric == 0.5 and session.best_round == 0
    best = session.best_weights.copy()
    assert np.allclose(best, start + 0.01)
    entry = session.complete_round(results_reporting(session, 5.0))  # 10x the best: diverged
    event = entry["events"][0]
    assert event["type"] == "divergence" and event["action"] == action and event["reason"].startswith("federated")
    if action == "stop":
        assert session.stopped and "diverged in round 2" in session.stopped
    else:
        assert session.stopped is None and np.array_equal(session.weights, best) and event["restored_round"] == 0


@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
def test_serve_refuses_a_local_task_without_parse_local_and_redundancy(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "forgetful.py"
    path.write_text(CSV_TASK.read_text().replace("def parse_local(", "def parse_local_not(")
                    .replace("self.parse_local(", "self.parse_local_not("))
    serve = ["serve", "--port", "0", "--admin-token", ADMIN_TOKEN]
    assert cli.main([*serve, "--task", str(path), "--session-dir", str(tmp_path / "a")]) == 2
    assert "is declared kind = 'local' but does not define parse_local(name, content)" in capsys.readouterr().err
    assert cli.main(["package", "--task", str(path), "--out", str(tmp_path / "p")]) == 2
    assert "does not define parse_local" in capsys.readouterr().err
    assert cli.main([*serve, "--task", str(CSV_TASK), "--session-dir", str(tmp_path / "b"), "--redundancy",
                     "0.5"]) == 2
    assert "--redundancy compares two peers' results" in capsys.readouterr().err


def test_an_async_merge_records_federated_metrics_without_host_validation(federated_only: Package) -> None:
    session = Session.create(federated_only, SessionConfig(participants=2, passes=1, mode="async"))
    result = UnitResult(session.weights + 0.01, 10, {"federated_val_loss": 0.7, "federated_examples": 4,
                                                     "train_loss": 0.5})
    entry = session.complete_buffer([(0, result), (1, result)], validate=True)
    assert entry["metrics"] == {} and entry["train"] == {"train_loss": 0.5}
    assert entry["federated"] == {"of_round": 0, "metrics": {"val_loss": 0.7}, "examples": 8, "results": 2}
