"""Where the host replays a unit: on the browser's own engine (``PyodideEngine``: Pyodide under Node), or natively.

A browser trains with Pyodide's numpy and our WebAssembly matmul kernel, whose summation order is fixed, so one
unit gives the same bytes in every browser. Native numpy sums in OpenBLAS's order instead, and on a task whose
training amplifies last-bit differences (Adam's division by tiny second moments; one flipped action forks a
CartPole episode) a native replay of an honest browser unit can land far from it. So the host replays on the
browser's engine: the ``pyodide`` npm package, lock file and wheels the page loads, under Node, calling the same
Python module the page's worker calls (``runtime.worker``). A CPU unit replayed there must give the browser's
bytes exactly, and is compared bit for bit.

``PyodideEngine`` is one long-lived Node process (``pyodide_replay.cjs``): it boots once (a few seconds) and then
trains job after job, fed over its standard input. The relay keeps a pool of them, one per replay thread
(``server.relay.verify.Verifier``); they exit when their standard input closes, so a relay that stops, or is killed,
leaves none behind, and a restarted relay starts its own. A worker that dies or hangs is killed and started again
for the next job; the replay it was running fails as the host's trouble, never as the peer's.

``NativeEngine`` (``runtime.peer.Peer`` in the relay's process) is the fallback where Node or the Pyodide assets
are missing: results are then compared within a tolerance, and tasks whose units part ways across engines
(``Task.replay_across_engines``) run without replays, as before the pool existed.
"""

from __future__ import annotations

import collections
import json
import os
import select
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runtime import wire
from runtime.peer import Peer, engine
from runtime.protocol import Job
from server.paths import REPO_ROOT

SCRIPT = Path(__file__).with_name("pyodide_replay.cjs")
PYODIDE_DIR = REPO_ROOT / "web" / "node_modules" / "pyodide"
WHEELS_DIR = REPO_ROOT / "wheels"
PYODIDE_CPU = "pyodide-numpy"  # what a result trained in a browser's worker on the CPU says (``runtime.peer.engine``)
NATIVE = engine()  # ``native-numpy``
ENGINE_CHOICES = ("auto", "pyodide", "native")
BOOT_SECONDS = 240.0  # Pyodide's boot and numpy's import, on a loaded machine
# A replay worker that has not answered a job by then is taken for hung (killed; the replay fails as the host's).
JOB_SECONDS = 600.0


class EngineError(RuntimeError):
    """The host could not replay a unit (its engine failed, not the peer's result): no verdict against anyone."""


class Engine(Protocol):
    name: str  # the engine a result names in its header when it was trained the way this engine trains

    def train(self, task_info: dict[str, Any], job: Job, weights_message: bytes,
              unit_message: bytes | None) -> bytes: ...

    def close(self) -> None: ...


def default_workers() -> int:
    """The pool's size from the machine: half its cores (the rest serve requests and merge), 2 to 8. At least two:
    replays run while the peers train, when the relay's cores are otherwise idle, and a round of k = 5 at a share of
    25 % replays 2 or 3 units; one worker on two cores made the merge wait 1.34 s a round (63 % of a browser unit),
    two made it wait 0.00 s (``bench relay --verify-fraction 0.25``). Each worker holds a Pyodide heap (about 150 MB
    for the built-in tasks)."""
    return max(2, min(8, (os.cpu_count() or 2) // 2))


def pyodide_missing(pyodide_dir: Path = PYODIDE_DIR, wheels_dir: Path = WHEELS_DIR) -> str | None:
    """Why the browser's engine cannot run here (None: it can)."""
    if shutil.which("node") is None:
        return "node is not on PATH"
    if not (pyodide_dir / "pyodide.asm.wasm").is_file():
        return f"{pyodide_dir} has no Pyodide (run `make setup`)"
    if not (wheels_dir / "pyodide-lock.json").is_file():
        return f"{wheels_dir}/pyodide-lock.json is missing (run `make setup`)"
    return None


def host_only_task(manifest: Mapping[str, Any]) -> str | None:
    """The task's module where it comes from this machine's Python path: neither the runtime's nor a file ``serve``
    builds a wheel of, so no browser and no Pyodide replay on the host can import it (None: they can)."""
    module = str(manifest.get("task_import", "")).partition(":")[0]
    if manifest.get("task_source") or not module or module == "runtime" or module.startswith("runtime."):
        return None
    return module


def resolve(choice: str, host_only: str | None = None) -> tuple[str, str | None]:
    """``--replay-engine``'s choice as the engine the relay runs (``pyodide`` or ``native``) and, when ``auto`` had to
    fall back, why: Pyodide cannot run here, or cannot import the task (``host_only``: its module, from this machine's
    Python path, ``host_only_task``), where every replay would fail and leave its result unchecked. ``pyodide`` asked
    for where it cannot run is an error."""
    if choice not in ENGINE_CHOICES:
        raise ValueError(f"replay engine must be one of {', '.join(ENGINE_CHOICES)}, got {choice!r}")
    if choice == "native":
        return "native", None
    missing = pyodide_missing()
    if missing is None and choice == "auto" and host_only:
        return "native", (f"the task module {host_only} comes from this machine's Python path, which Pyodide cannot "
                          "import")
    if missing is None:
        return "pyodide", None
    if choice == "pyodide":
        raise ValueError(f"--replay-engine pyodide cannot run here: {missing}")
    return "native", missing


class NativeEngine:
    """Replays in this process with ``runtime.peer.Peer`` (one per thread: the caller keeps one engine per thread)."""

    name = NATIVE

    def __init__(self) -> None:
        self._peer: Peer | None = None

    def train(self, task_info: dict[str, Any], job: Job, weights_message: bytes,
              unit_message: bytes | None) -> bytes:
        if self._peer is None or self._peer.fingerprint != task_info["fingerprint"]:
            self._peer = Peer(task_info)
        self._peer.set_weights(weights_message)
        return self._peer.train(job.dumps(), unit_message)

    def close(self) -> None:
        self._peer = None


@dataclass
class _Process:
    popen: subprocess.Popen[bytes]
    errors: collections.deque[str]
    boot: dict[str, Any]


class PyodideEngine:
    """One Node process running Pyodide (``pyodide_replay.cjs``); started on first use, restarted after a failure.
    Not thread-safe: one per replay thread."""

    name = PYODIDE_CPU

    def __init__(self, *, pyodide_dir: Path = PYODIDE_DIR, wheels_dir: Path = WHEELS_DIR,
                 job_seconds: float = JOB_SECONDS) -> None:
        self.pyodide_dir, self.wheels_dir, self.job_seconds = pyodide_dir, wheels_dir, job_seconds
        self._process: _Process | None = None
        self.boots = 0  # processes started (a restart after a failure is one more)
        self._locked: frozenset[str] | None = None

    def locked_packages(self) -> frozenset[str]:
        """The packages this engine's lock file names (read once)."""
        if self._locked is None:
            lock = json.loads((self.wheels_dir / "pyodide-lock.json").read_text())
            self._locked = frozenset(lock.get("packages", {}))
        return self._locked

    @property
    def boot_report(self) -> dict[str, Any]:
        """What the worker's Pyodide said at boot (versions, the matmul kernel), starting it if need be."""
        return self._running().boot

    def train(self, task_info: dict[str, Any], job: Job, weights_message: bytes,
              unit_message: bytes | None) -> bytes:
        process = self._running()
        source = task_source(task_info, self.locked_packages())
        task = {**task_info, "wheel": None} if source is not None else task_info  # (from its text, not a wheel)
        header = json.dumps({"task": task, "job": job.to_json(), "source": source}).encode()
        deadline = time.monotonic() + self.job_seconds
        try:
            assert process.popen.stdin is not None
            process.popen.stdin.write(b"".join(frame(part) for part in (header, weights_message, unit_message or b"")))
            process.popen.stdin.flush()
            answer = json.loads(self._read_frame(process, deadline))
            result = self._read_frame(process, deadline)
        except (OSError, EngineError, ValueError) as error:
            self._stop(kill=True)
            raise EngineError(f"the Pyodide replay worker failed: {error}{self._tail(process)}") from error
        if not answer.get("ok"):  # (Python raised in the worker: the job could not be trained there)
            raise EngineError(f"the unit could not be replayed in Pyodide: {answer.get('error')}")
        return result

    def close(self) -> None:
        self._stop(kill=False)

    # -- the process ---------------------------------------------------------------------------------------------
    def _running(self) -> _Process:
        if self._process is not None and self._process.popen.poll() is None:
            return self._process
        self._stop(kill=True)
        node = shutil.which("node")
        if node is None:
            raise EngineError("node is not on PATH")
        popen = subprocess.Popen([node, str(SCRIPT), str(self.pyodide_dir), str(self.wheels_dir)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 cwd=REPO_ROOT)
        errors: collections.deque[str] = collections.deque(maxlen=40)
        threading.Thread(target=_drain, args=(popen, errors), daemon=True, name="replay-stderr").start()
        process = _Process(popen, errors, {})
        self._process = process
        self.boots += 1
        try:
            process.boot = json.loads(self._read_frame(process, time.monotonic() + BOOT_SECONDS))
        except (OSError, EngineError, ValueError) as error:
            self._stop(kill=True)
            raise EngineError(f"the Pyodide replay worker did not boot: {error}{self._tail(process)}") from error
        return process

    def _read_frame(self, process: _Process, deadline: float) -> bytes:
        size = struct.unpack("<I", self._read_exact(process, 4, deadline))[0]
        return self._read_exact(process, size, deadline)

    @staticmethod
    def _read_exact(process: _Process, size: int, deadline: float) -> bytes:
        stdout = process.popen.stdout
        assert stdout is not None
        chunks, left = [], size
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineError("no answer in time")
            ready, _, _ = select.select([stdout], [], [], min(remaining, 5.0))
            if not ready:
                continue
            chunk = os.read(stdout.fileno(), min(left, 1 << 20))
            if not chunk:
                raise EngineError(f"the worker exited (code {process.popen.poll()})")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _stop(self, *, kill: bool) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        popen = process.popen
        try:
            if popen.stdin is not None:
                popen.stdin.close()  # (the worker exits at the end of its input)
        except OSError:
            pass
        try:
            if kill:
                popen.kill()
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=10)
        if popen.stdout is not None:
            popen.stdout.close()

    @staticmethod
    def _tail(process: _Process) -> str:
        lines = list(process.errors)[-5:]
        return ("; its last words: " + " | ".join(lines)) if lines else ""


def frame(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


def _drain(popen: subprocess.Popen[bytes], errors: collections.deque[str]) -> None:
    """The worker's standard error (Python's prints, Node's errors), kept short for error messages."""
    assert popen.stderr is not None
    for line in popen.stderr:
        errors.append(line.decode("utf-8", "replace").rstrip())
    popen.stderr.close()


def task_source(task_info: dict[str, Any], locked: frozenset[str] = frozenset()) -> dict[str, str] | None:
    """A task given as a file (``task_source``) whose wheel is not among the ``locked`` packages of the engine's
    wheels: its module's text, which the worker imports by the task's module name. (``serve`` builds the wheel pages
    install from the same file into the session's own folder, not the install's ``wheels/`` the engine loads.)"""
    path = task_info.get("task_source")
    if not path or task_info.get("wheel") in locked:
        return None
    return {"module": str(task_info["task_import"]).partition(":")[0], "text": Path(path).read_text()}


def make_engine(kind: str) -> Engine:
    return PyodideEngine() if kind == "pyodide" else NativeEngine()


def result_engine(message: bytes) -> str:
    """The engine a result message says it was trained on."""
    return str(wire.read_header(message).meta.get("engine", ""))
