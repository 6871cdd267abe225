"""The one Python module the page's Web Worker calls, reached once with ``pyodide.pyimport("runtime.worker")``.

The worker passes plain values (JSON strings, and the relay's binary messages as JavaScript
``Uint8Array``s, which ``runtime.peer.as_bytes`` reads) and gets plain values back: JSON strings, an
int, and the result message as bytes. Nothing goes through ``pyodide.globals`` and the worker runs no
Python source of its own; what it holds between calls is the ``WorkerPeer`` that ``build_peer`` returns.

    boot(blas)                  the boot report (versions, which matmul runs) as JSON
    build_peer(task_info)       a WorkerPeer for ``GET /api/task``'s JSON
    WorkerPeer.choose_device    (async) cpu | webgpu | auto -> the choice as JSON
    WorkerPeer.set_weights      the round's weights message, or a chain of steps from the weights held -> its round
    WorkerPeer.weights_sha      the digest of the weights held (a job's weights_digest names the ones it needs)
    WorkerPeer.residual, WorkerPeer.restore_residual   a codec's error-feedback residual out to IndexedDB and back
    WorkerPeer.keeps_residual                           whether the last unit's codec keeps one
    WorkerPeer.train            one job -> (result message, metrics as JSON)
    WorkerPeer.respond          global weights + a visitor's prompt -> the task's answer as JSON
    WorkerPeer.add_local_file   local tasks: a chosen file's name and bytes -> its report as JSON
    WorkerPeer.clear_local_files, WorkerPeer.local_summary   local tasks: forget the files; the summary as JSON

The same calls run natively (``tests/runtime/test_worker_entry.py``), so a unit trained through this
module in a browser is the unit a native peer trains.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

import runtime
from runtime import device
from runtime.peer import Peer, as_bytes
from runtime.protocol import Job

NUMPY_MATMUL = "numpy (no BLAS)"
CPU_DESCRIPTION = "CPU (numpy in Pyodide)"


def boot(blas: str = "") -> str:
    """The boot report as JSON: ``{"python", "numpy", "runtime", "matmul", "matmul_error"}``.

    Pyodide's numpy has no BLAS (its matmul is a plain loop); unless ``blas == "numpy"`` (the page's
    ``?blas=numpy``), the runtime's WebAssembly SIMD kernel becomes the numpy backend's matmul, the same
    float32 sums about 15x faster. Where the kernel cannot be loaded (natively, or an engine without SIMD)
    numpy's loop stays and ``matmul_error`` says why; the worker logs it, the peer still trains.
    """
    matmul, error = NUMPY_MATMUL, None
    if blas != "numpy":
        from runtime.backend import wasm_gemm

        try:
            matmul = wasm_gemm.install()
        except Exception as failure:  # any failure to load a side module leaves numpy's loop, which works
            error = f"SIMD matmul kernel unavailable, numpy's loop instead: {type(failure).__name__}: {failure}"
    return json.dumps({"python": sys.version.split()[0], "numpy": np.__version__,
                       "runtime": getattr(runtime, "__version__", "unknown"), "matmul": matmul,
                       "matmul_error": error})


class WorkerPeer:
    """A ``runtime.peer.Peer`` and the device it trains on, for one session's task."""

    def __init__(self, task_info: str | dict[str, Any]) -> None:
        self.peer = Peer(task_info)
        self.on_webgpu = False  # True once choose_device picked WebGPU: train through callPromising then

    @property
    def fingerprint(self) -> str:
        return self.peer.fingerprint

    async def choose_device(self, mode: str, steps: int = 2) -> str:
        """The device for ``mode`` (``cpu``, ``webgpu`` or ``auto``) as JSON: ``{"chosen", "description", ...}``.

        ``cpu`` decides nothing and times nothing. The others go through ``runtime.device.choose_for_peer``,
        which times the task's own probe and tells the page (a ``device`` message); call this through
        ``callPromising`` so that the probe's reads may block on the GPU.
        """
        if mode == "cpu":
            self.on_webgpu = False
            return json.dumps({"chosen": "cpu", "requested": "cpu", "description": CPU_DESCRIPTION})
        choice = json.loads(await device.choose_for_peer(self.peer, mode))
        self.on_webgpu = choice["chosen"] == "webgpu"
        return json.dumps(choice)

    def set_weights(self, message: object) -> int:
        """Keep the round's global weights (a weights message or a chain of steps); returns their round."""
        return self.peer.set_weights(message)

    @property
    def keeps_residual(self) -> bool:
        """Whether the last unit's codec keeps an error-feedback residual (the page then saves ``residual``)."""
        return self.peer.keeps_residual

    def residual(self) -> bytes:
        """The error-feedback residual (what topk dropped so far) as float32 bytes: the page keeps it in IndexedDB,
        so a reload loses nothing of it."""
        return self.peer.feedback.residual.astype("<f4").tobytes()

    def restore_residual(self, message: object) -> int:
        """A residual the page kept (``residual``'s bytes) back into the peer; returns how many entries were
        restored (0: not this model's size, or not finite, and the residual stays zero)."""
        data = as_bytes(message)
        size = self.peer.spec.size
        if len(data) != 4 * size:
            return 0
        residual = np.frombuffer(data, dtype="<f4").astype(np.float32)
        if not np.isfinite(residual).all():
            return 0
        self.peer.feedback.residual = residual
        return size

    @property
    def weights_round(self) -> int | None:
        return self.peer.weights_round

    @property
    def weights_sha(self) -> str:
        """The digest of the weights held ("" before any): the page asks for a chain from them."""
        return self.peer.weights_sha or ""

    def train(self, job: str | Job, unit: object = None) -> tuple[bytes, str]:
        """Train one job (``POST /api/work``'s assignment, as JSON: a ``runtime.protocol.Job``) on the chosen device,
        with the unit's data message for data tasks; returns the result message to upload and the unit's metrics as
        JSON.

        On WebGPU this must be entered through ``callPromising`` (mid-step reads block through JSPI).
        """
        assignment = job if isinstance(job, Job) else Job.from_json(job)
        if self.on_webgpu:
            result = device.train_on_device(self.peer, assignment.dumps(), unit)
        else:
            result = self.peer.train(assignment, unit)
        return bytes(result), self.peer.last_metrics_json


    # -- local tasks: the files a person chose in the page (read there with the File API; never uploaded) ----------
    def add_local_file(self, name: str, content: object) -> str:
        """Parse one chosen file (a ``Uint8Array`` of its bytes) with the task's ``parse_local``; its report
        (``{"name", "size", "examples", "error"}``) as JSON. A file of the same name replaces the earlier one."""
        from runtime.peer import as_bytes

        return json.dumps(self._local().add(str(name), as_bytes(content)).to_json())

    def clear_local_files(self) -> None:
        self._local().clear()

    def set_local_privacy(self, noise_multiplier: float, clip: float) -> None:
        """The volunteer's own differential privacy (``runtime.peer.Peer.set_local_privacy``; 0: off)."""
        self.peer.set_local_privacy(float(noise_multiplier), float(clip))

    def local_summary(self) -> str:
        """What the page shows beside its file picker (``runtime.tasks.local.LocalData.summary``), as JSON."""
        return json.dumps(self._local().summary())

    def _local(self) -> Any:
        if self.peer.local is None:
            from runtime.tasks.base import TaskError

            raise TaskError(f"task {self.peer.task.name!r} is not a local task: it trains on no files of yours")
        return self.peer.local

    def respond(self, weights_message: object, prompt: str) -> str:
        """The page's "Try the model": the task's answer to ``prompt`` from the given global weights (not the
        ones this peer trains from, which it leaves alone), as JSON with the weights' ``round``, or
        ``{"error": ...}`` when the task refuses the prompt."""
        from runtime import wire
        from runtime.peer import as_bytes
        from runtime.tasks.base import TaskError

        header, weights = wire.decode(as_bytes(weights_message), expect_spec=self.peer.spec,
                                      expect_fingerprint=self.peer.fingerprint)
        try:
            answer = self.peer.task.respond(weights, str(prompt))
        except TaskError as error:
            return json.dumps({"error": str(error), "round": header.round})
        return json.dumps({**answer, "round": header.round})


def build_peer(task_info: str | dict[str, Any]) -> WorkerPeer:
    """The peer for ``GET /api/task``'s JSON (its task wheel, if any, already installed)."""
    return WorkerPeer(task_info)
