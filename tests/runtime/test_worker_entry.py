"""``runtime.worker``, the module the page's Web Worker calls, driven natively the way the worker drives it.

The worker's calls are made here with the same values it passes: ``GET /api/task``'s JSON as a string,
the relay's weights and unit messages as bytes, the job as JSON. One test runs a whole session through an
in-process relay over HTTP (join, work, weights, unit, result) and checks the relay's final weights
against the same units trained without a relay.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from coroutines import run_to_completion
from starlette.testclient import TestClient

import runtime
from runtime import wire, worker
from runtime.backend import wasm_gemm
from runtime.peer import engine_build, engine_class
from runtime.protocol import Done, Job, work_answer_from_json
from runtime.tasks import TaskError
from server.relay.app import RelayPaths, create_app
from server.relay.options import RelayOptions
from server.relay.state import Relay
from server.relay.store import open_store
from server.session.package import TASK_FIELDS, Package
from server.session.session import Session, SessionConfig


def task_info(package: Package) -> str:
    """What ``GET /api/task`` answers for ``package``, as the JSON text the worker hands over."""
    manifest = package.manifest
    info = {key: manifest[key] for key in TASK_FIELDS} | {"assets": package.data.assets,
                                                          "wheel": manifest.get("wheel"),
                                                          "limits": {"hold_seconds": 15.0}}
    return json.dumps(info)


def weights_message(package: Package, weights: np.ndarray, round_index: int) -> bytes:
    header = wire.WireHeader(spec=package.spec, round=round_index, fingerprint=package.fingerprint, num_examples=0)
    return wire.encode(weights, header)


def test_boot_reports_versions_and_keeps_numpy_matmul_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run() -> str:
        raise AssertionError("?blas=numpy must not install the kernel")

    monkeypatch.setattr(wasm_gemm, "install", must_not_run)
    report = json.loads(worker.boot("numpy"))
    assert report == {"python": sys.version.split()[0], "numpy": np.__version__, "runtime": runtime.__version__,
                      "matmul": worker.NUMPY_MATMUL, "matmul_error": None}


def test_boot_installs_the_kernel_and_falls_back_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wasm_gemm, "install", lambda: "WebAssembly SIMD kernel (test)")
    assert json.loads(worker.boot(""))["matmul"] == "WebAssembly SIMD kernel (test)"

    def broken() -> str:
        raise OSError("invalid ELF header")

    monkeypatch.setattr(wasm_gemm, "install", broken)
    report = json.loads(worker.boot())
    assert report["matmul"] == worker.NUMPY_MATMUL
    assert "OSError: invalid ELF header" in report["matmul_error"]


def test_one_job_from_task_json_and_messages(package: Package) -> None:
    session = Session.create(package, SessionConfig(participants=2, passes=1))
    peer = worker.build_peer(task_info(package))
    assert peer.fingerprint == package.fingerprint
    choice = json.loads(run_to_completion(peer.choose_device("cpu")))
    assert choice["chosen"] == "cpu" and not peer.on_webgpu and "CPU" in choice["description"]

    assert peer.set_weights(weights_message(package, session.weights, 0)) == 0 == peer.weights_round
    assignment = session.assignments()[1]
    unit = session.work_unit(assignment)
    job = Job(**assignment.to_json(), kind="data", episodes=unit.episodes, progress=unit.progress, lease_deadline=0.0,
              lease_seconds=60.0, weights_round=0, num_rounds=session.num_rounds, fingerprint=package.fingerprint)
    result, metrics_json = peer.train(job.dumps(), bytearray(package.chunk_bytes(assignment.unit_index)))

    header, vector = wire.decode(result, expect_spec=package.spec, expect_round=0,
                                 expect_fingerprint=package.fingerprint)
    assert header.meta == {"slot": assignment.slot, "unit_index": assignment.unit_index, "engine": "native-numpy",
                           "engine_class": engine_class()}
    assert engine_build().startswith(f"numpy-{np.__version__} ")  # (and its BLAS, its SIMD)
    assert engine_class() == f"native-numpy {hashlib.sha256(engine_build().encode()).hexdigest()[:12]}"
    native = package.task.train_unit(session.weights, unit)
    assert np.array_equal(vector, native.weights)
    assert header.num_examples == native.num_examples
    metrics = json.loads(metrics_json)
    assert metrics["seconds"] > 0 and metrics == header.metrics

    with pytest.raises(TaskError, match="assignment is for round 1"):
        peer.train(dataclasses.replace(job, round=1).dumps(), package.chunk_bytes(assignment.unit_index))

    # Whether the page saves the error-feedback residual is the codec's to say (the page names no codec).
    assert not peer.keeps_residual
    for codec, keeps in (({"name": "topk", "block": 256, "fraction": 0.1}, True), ({"name": "int8"}, False)):
        peer.train(dataclasses.replace(job, codec=codec).dumps(), package.chunk_bytes(assignment.unit_index))
        assert peer.keeps_residual is keeps


def test_a_session_through_the_relay_api(package: Package, tmp_path: Path) -> None:
    """Two worker peers talk to an in-process relay as the browser's worker does; the session completes with
    the weights of the same units trained without a relay."""
    config = SessionConfig(participants=2, passes=1)
    relay = Relay(session=Session.create(package, config, directory=tmp_path / "session"), package=package,
                  store=open_store(tmp_path / "relay.sqlite3"), options=RelayOptions(admin_token="admin"))
    try:
        with TestClient(create_app(RelayPaths(), relay)) as client:
            info = client.get("/api/task")
            assert info.json()["limits"]["hold_seconds"] > 0
            peers = []
            for _ in range(2):
                joined = client.post("/api/join", content=b"{}").json()
                headers = {"Authorization": f"Bearer {joined['peer_id']}:{joined['token']}"}
                peer = worker.build_peer(info.text)
                run_to_completion(peer.choose_device("cpu"))
                peers.append((peer, headers))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                jobs = [(peer, headers, work_answer_from_json(client.post("/api/work", headers=headers).text))
                        for peer, headers in peers]
                if any(isinstance(job, Done) for _, _, job in jobs):
                    break
                for peer, headers, job in jobs:
                    if not isinstance(job, Job):
                        continue
                    if peer.weights_round != job.weights_round:
                        peer.set_weights(client.get("/api/weights", headers=headers).content)
                    chunk = client.get(f"/api/unit/{job.unit_index}", headers=headers).content
                    result, _ = peer.train(job.dumps(), chunk)
                    answer = client.post(f"/api/result?round={job.round}&slot={job.slot}", content=result,
                                         headers=headers)
                    assert answer.status_code == 200, answer.text
                time.sleep(0.02)  # the merge runs in the background on the app's event loop
            status = client.get("/api/session").json()
    finally:
        relay.store.close()

    assert status["done"], status
    assert status["counters"]["results_accepted"] == 4 and not any(k.startswith("refused.") for k in status["counters"])
    reference = Session.create(package, config)
    while not reference.done:
        reference.complete_round([(a, package.task.train_unit(reference.weights, reference.work_unit(a)))
                                  for a in reference.assignments()])
    assert np.array_equal(relay.session.weights, reference.weights)
    assert status["history"][-1]["metrics"] == reference.history[-1]["metrics"]


def test_the_residual_goes_out_and_back_and_a_wrong_one_is_not_taken(package: Package) -> None:
    """What the page keeps in IndexedDB: topk's residual as float32 bytes; one of another size or with a NaN is not
    taken (the residual stays as it was)."""
    peer = worker.build_peer(task_info(package))
    size = package.spec.size
    residual = np.linspace(-1, 1, size, dtype=np.float32)
    assert peer.restore_residual(residual.tobytes()) == size
    assert peer.residual() == residual.tobytes()
    bad = residual.copy()
    bad[3] = np.nan
    assert peer.restore_residual(bad.tobytes()) == 0 and peer.restore_residual(b"\x00" * 8) == 0
    assert peer.residual() == residual.tobytes()
