"""What ``peertrain bench replay`` (``server.bench.replay``) runs in the page's worker, as Python source: join, build
the peer exactly as the page does, then batches of units (get work, the round's weights once per round, the unit's
data, train through ``runtime.worker``, upload), handing back what the host needs to replay each unit exactly."""

from __future__ import annotations

import hashlib
import inspect

import numpy as np

# Run once per page: join, build the peer exactly as the page does, choose the device. Leaves the globals the
# batch call uses. The last expression is the task JSON (as received) and the device choice.
WORKER_SETUP = """
import asyncio, base64, hashlib, json, time
import numpy as np
from pyodide.ffi import to_js
from pyodide.http import pyfetch
from runtime.protocol import Done, Wait, work_answer_from_json
from runtime.worker import build_peer

async def _bench_get(path, **options):
    response = await pyfetch(path, **options)
    if not response.ok:
        raise RuntimeError(f"{path}: HTTP {response.status}: {await response.string()}")
    return response

_bench_joined = await (await _bench_get("/api/join", method="POST", body="{}")).json()
_bench_auth = {"Authorization": f"Bearer {_bench_joined['peer_id']}:{_bench_joined['token']}"}
_bench_task = await (await _bench_get("/api/task")).string()
_bench_peer = build_peer(_bench_task)

async def _bench_batch(units, seconds, hold, max_waits):
    # Train up to `units` units (stopping after `seconds`): get work, the round's weights (once per round),
    # the unit's data, train, upload. Returns what the host needs to replay each unit exactly.
    out, started = {"units": [], "weights": {}, "done": False}, time.perf_counter()
    while len(out["units"]) < units and (not out["units"] or time.perf_counter() - started < seconds):
        for _ in range(max_waits):
            answer = work_answer_from_json(await (await _bench_get(f"/api/work?hold={hold}", method="POST",
                                                                    headers=_bench_auth)).string())
            if not isinstance(answer, Wait):
                break
            await asyncio.sleep(answer.wait or 0.01)
        else:
            raise RuntimeError(f"no work after {max_waits} held requests: {answer}")
        if isinstance(answer, Done):
            out["done"] = True
            break
        job = answer
        if _bench_peer.weights_round != job.round:
            message = await (await _bench_get("/api/weights", headers=_bench_auth)).bytes()
            if _bench_peer.set_weights(message) != job.round:
                raise RuntimeError(f"weights of round {_bench_peer.weights_round} for a job of round {job.round}")
            out["weights"][str(job.round)] = base64.b64encode(message).decode()
        unit = None
        if job.kind == "data":
            unit = await (await _bench_get(f"/api/unit/{job.unit_index}", headers=_bench_auth)).bytes()
        tic = time.perf_counter()
        result, metrics = _bench_peer.train(job.dumps(), unit)
        seconds_trained = time.perf_counter() - tic
        actions = _bench_actions(job)
        await _bench_get(f"/api/result?round={job.round}&slot={job.slot}", method="POST",
                         headers=_bench_auth, body=to_js(memoryview(result)))
        out["units"].append({"job": job.to_json(), "result": base64.b64encode(result).decode(),
                             "seconds": seconds_trained,
                             "unit_sha256": hashlib.sha256(unit).hexdigest() if unit is not None else None,
                             "actions_sha256": actions})
    return json.dumps(out)

def _bench_actions(job):
    # An experience task's episodes played again from the same weights and seed: a digest of every action.
    task = _bench_peer.peer.task
    if job.kind != "experience" or not hasattr(task, "play"):
        return None
    return actions_digest(task.play(_bench_peer.peer.weights, job.unit_seed, job.episodes))

_bench_task
"""


def actions_digest(trajectories: list) -> str:
    """A digest of every action of an experience unit's episodes (the worker runs this same source)."""
    digest = hashlib.sha256()
    for trajectory in trajectories:
        digest.update(np.asarray(trajectory.actions, dtype=np.int64).tobytes() + b"|")
    return digest.hexdigest()


WORKER_SETUP = WORKER_SETUP.replace("\n_bench_task\n", "\n" + inspect.getsource(actions_digest) + "\n_bench_task\n")
WORKER_DEVICE = "await _bench_peer.choose_device({device!r})"
WORKER_BATCH = "await _bench_batch({units}, {seconds}, {hold}, {max_waits})"
