"""The one Python entry point a peer's worker talks to: bytes in, bytes out.

The worker hands over what the relay sent (the task description as JSON, the global weights and the
unit's data in the wire codec) and gets back the result message to upload. The same code runs in a
browser's Pyodide and natively (tests, simulated peers), so a unit trained in either place is the
same computation. A local task's peer also holds the files its person chose (``local``: parsed by the task,
``runtime.tasks.local``); its units train on them and their content never leaves the peer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import secrets
import sys
import time
from typing import Any

import numpy as np

from runtime import deltas, wire, wire_arrays
from runtime.backend import get_backend, numpy_backend
from runtime.codec import Codec, ErrorFeedback
from runtime.privacy import privatize_update
from runtime.protocol import Job
from runtime.tasks.base import Task, TaskError, UnitResult, WorkUnit, check_unit_result
from runtime.tasks.loader import task_class
from runtime.tasks.local import LocalData, train_local_unit
from runtime.weights import WeightSpec


def as_bytes(message: object) -> bytes:
    """Bytes from a Python buffer or, inside Pyodide, from a JavaScript Uint8Array/ArrayBuffer proxy."""
    to_py = getattr(message, "to_py", None)
    return bytes(to_py() if to_py is not None else message)  # type: ignore[arg-type]


def engine() -> str:
    """Where a unit is trained, as a result says (two copies of a unit from one engine must be identical):
    ``pyodide-numpy``, ``pyodide-webgpu`` or ``native-numpy``."""
    return f"{'pyodide' if sys.platform == 'emscripten' else 'native'}-{get_backend().name}"


# The engines whose float kernels give a unit the same bits on every machine of one engine class (``engine_class``);
# WebGPU's depend on the GPU and its driver, which a page cannot name for sure.
BIT_EXACT_ENGINES = ("pyodide-numpy", "native-numpy")


def engine_class() -> str:
    """The engine and what decides its results' last bits, as BOINC's homogeneous redundancy groups hosts: numpy's
    version, its BLAS library and the SIMD extensions numpy's kernels found on this CPU (OpenBLAS picks its kernels
    by them too) and, in Pyodide, the matmul kernel in numpy's place. Two peers of one class train a unit to the same
    bits; two classes may part in the last bits (another summation order), so the relay compares copies bit for bit
    within a class only. The engine and a digest of its build (``engine_build``), e.g. ``native-numpy 3f09a1c2b7d4``."""
    return f"{engine()} {hashlib.sha256(engine_build().encode()).hexdigest()[:12]}"


def engine_build() -> str:
    """What ``engine_class`` digests (12 hex digits in each result's header, which a small model's result stores
    with every message), in words: numpy's build and, in Pyodide, the matmul kernel in numpy's place. E.g.
    ``numpy-2.2.4 scipy-openblas-0.3.28 X86_V3+X86_V4``; in a browser ``numpy-2.0.2 wasm-simd-gemm-4x8``."""
    kernel = numpy_backend.matmul_kernel()  # (Pyodide: the SIMD kernel, or numpy's loop with ?blas=numpy)
    return _numpy_build() + (f" {kernel}" if kernel else "")


@functools.cache
def _numpy_build() -> str:
    """``engine_class``'s numpy part (read once: numpy's configuration does not change while it runs)."""
    parts = [f"numpy-{np.__version__}"]
    try:
        config: dict[str, Any] = np.show_config(mode="dicts") or {}  # type: ignore[func-returns-value,assignment]
    except Exception:  # (a numpy build without its configuration: the version alone)
        config = {}
    blas = (config.get("Build Dependencies") or {}).get("blas") or {}
    if blas.get("found") and blas.get("name"):
        parts.append(f"{blas['name']}-{blas.get('version', '')}".rstrip("-"))
    found = (config.get("SIMD Extensions") or {}).get("found") or []
    if found:
        parts.append("+".join(str(extension) for extension in found))
    return " ".join(part.replace(" ", "_") for part in parts)


class Peer:
    """A task ready to train units; built once per session from ``GET /api/task``'s JSON."""

    def __init__(self, task_info: str | dict[str, Any]) -> None:
        info = json.loads(task_info) if isinstance(task_info, str) else task_info
        self.task: Task = task_class(info["task_import"])(info["settings"])
        self.task.attach(info.get("assets") or {})
        self.spec = WeightSpec.from_json(info["spec"])
        self.fingerprint: str = info["fingerprint"]
        if self.task.spec() != self.spec:
            raise TaskError(f"the task built here has spec {self.task.spec().fingerprint()}, the relay's is "
                            f"{self.spec.fingerprint()}: the runtime or task wheel is out of date")
        self.weights: np.ndarray | None = None
        self.weights_round: int | None = None
        self.weights_sha: str | None = None  # the digest a job names its weights by (runtime.deltas)
        self.last_metrics_json = "{}"
        self.local: LocalData | None = LocalData(self.task) if self.task.kind == "local" else None
        self.feedback = ErrorFeedback(self.spec.size)  # what topk dropped so far (runtime.codec)
        self.keeps_residual = False  # the last unit's codec carries what it dropped into the next (error feedback)
        self.local_privacy: tuple[float, float] | None = None  # the volunteer's own DP: (noise multiplier, clip)

    def set_local_privacy(self, noise_multiplier: float, clip: float) -> None:
        """Local differential privacy, the volunteer's choice for a local task: each update is clipped to ``clip``
        and Gaussian noise of ``noise_multiplier * clip`` is added here, before it leaves (0: off)."""
        if noise_multiplier < 0 or not clip > 0 or not math.isfinite(noise_multiplier * clip):
            raise TaskError(f"local privacy takes a noise multiplier >= 0 and a clip > 0, got {noise_multiplier}, "
                            f"{clip}")
        if self.local is None and noise_multiplier > 0:
            raise TaskError(f"task {self.task.name!r} trains on the host's data, not yours: local privacy is for "
                            "local tasks")
        self.local_privacy = (float(noise_multiplier), float(clip)) if noise_multiplier > 0 else None

    def set_weights(self, message: object) -> int:
        """Keep the global weights: a weights message, or a chain of steps from the weights held (each step
        checked against the digest it names, ``runtime.deltas``); returns their round."""
        data = as_bytes(message)
        if deltas.is_chain(data):
            round_index, vector = deltas.apply_chain(data, self.weights, spec=self.spec, fingerprint=self.fingerprint)
        else:
            header, vector = wire.decode(data, expect_spec=self.spec, expect_fingerprint=self.fingerprint)
            round_index = header.round
        self.weights, self.weights_round, self.weights_sha = vector, round_index, deltas.weights_sha256(vector)
        return round_index

    def train(self, assignment: str | dict[str, Any] | Job, unit_message: object = None) -> bytes:
        """Train one assignment (a ``runtime.protocol.Job``, or its JSON as the relay sent it) from the kept weights;
        returns the wire-encoded result to upload."""
        job = assignment if isinstance(assignment, Job) else Job.from_json(assignment)
        named = job.weights_digest  # (a relay before content-addressed weights names none: the round then)
        if self.weights is None or (self.weights_sha != named if named else self.weights_round != job.round):
            raise TaskError(f"weights of round {self.weights_round} held, assignment is for round {job.round}"
                            + (f" (weights {named[:16]})" if named else ""))
        started = time.perf_counter()
        if self.local is not None:  # a local unit: this peer's own examples (their content stays here)
            unit = self.local.work_unit(job.unit_index, job.unit_seed, job.progress)
            result = train_local_unit(self.task, self.weights, unit)
            if self.local_privacy is not None:  # the volunteer's own noise; its losses are not reported either
                z, clip = self.local_privacy
                noised = privatize_update(self.weights, result.weights, z, clip,
                                          np.random.default_rng(secrets.randbits(128)))
                result = UnitResult(noised, result.num_examples, {})
        else:
            data = None
            if unit_message is not None:
                _, data = wire_arrays.decode_array(as_bytes(unit_message), expect_dtype="int32")
            unit = WorkUnit(index=job.unit_index, seed=job.unit_seed, data=data, episodes=job.episodes,
                            progress=job.progress)
            result = check_unit_result(self.task, self.task.train_unit(self.weights, unit), self.spec)
        metrics = {k: float(v) for k, v in result.metrics.items() if isinstance(v, int | float)}
        metrics["seconds"] = time.perf_counter() - started
        self.last_metrics_json = json.dumps(metrics)
        header = wire.WireHeader(spec=self.spec, round=job.round, fingerprint=self.fingerprint,
                                 num_examples=int(result.num_examples), metrics=metrics,
                                 meta={"slot": job.slot, "unit_index": unit.index, "engine": engine(),
                                       "engine_class": engine_class(),
                                       **({"local_dp": {"noise_multiplier": self.local_privacy[0],
                                                        "clip": self.local_privacy[1]}} if self.local_privacy else {})})
        codec = Codec.from_json(job.codec) if job.codec else Codec()
        self.keeps_residual = codec.needs_error_feedback
        if not codec.compresses:
            return wire.encode(result.weights, header)
        # The update against the weights handed out, in the session's codec (seeded by the unit: a replay or a
        # second copy gives the same bytes); topk adds what it dropped before to it (error feedback).
        update = (np.asarray(result.weights, dtype=np.float32) - self.weights).astype(np.float32)
        payload, _ = self.feedback.encode(codec, update, seed=job.unit_seed)
        return wire.encode_update(payload, header, codec, wire.weights_digest(self.weights))
