"""The Task hooks generic code calls: ``work_unit`` (what a unit holds) and ``device_probe`` (what ``auto`` times).

The probes run here on the numpy backend; the device chooser is checked to time the task's own probe, with a
numpy backend standing in for WebGPU (the real one runs in tests/browser).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coroutines import run_to_completion

import runtime.backend.webgpu as webgpu
from runtime import device
from runtime.backend import set_backend
from runtime.backend.numpy_backend import NumpyBackend
from runtime.device_probe import Probe
from runtime.optim import Adam
from runtime.tasks import Task, TaskData, TaskError, WorkUnit
from runtime.tasks.arith import ArithTask
from runtime.tasks.bytetext import ByteTextTask
from runtime.tasks.cartpole import CartPoleTask, PolicyBatch, update_policy
from runtime.train_step import lm_step

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


class Episodic(Task):
    kind = "experience"


class LongEpisodes(Episodic):
    def episodes_per_unit(self) -> int:
        return 7


def chunks() -> TaskData:
    return TaskData(num_units=3, units=[np.full(4, i, dtype=np.int32) for i in range(3)])


def test_a_data_unit_is_its_chunk() -> None:
    data = chunks()
    unit = ByteTextTask().work_unit(data, 2, seed=9, progress=0.5)
    assert data.units is not None and unit.data is data.units[2]
    assert (unit.index, unit.seed, unit.episodes, unit.progress) == (2, 9, 0, 0.5)
    assert unit.data is not None and unit.data.tolist() == [2, 2, 2, 2]


def test_a_data_task_without_chunks_is_refused() -> None:
    with pytest.raises(TaskError, match="has no units"):
        ByteTextTask().work_unit(TaskData(num_units=1), 0, seed=0)


def test_an_experience_unit_is_the_tasks_episode_budget() -> None:
    empty = TaskData(num_units=5)
    assert Episodic().work_unit(empty, 1, seed=3) == WorkUnit(index=1, seed=3, episodes=1)
    assert LongEpisodes().work_unit(empty, 4, seed=3, progress=0.25) == WorkUnit(index=4, seed=3, episodes=7,
                                                                                   progress=0.25)
    cartpole = CartPoleTask({"episodes_per_unit": 5})
    assert cartpole.episodes_per_unit() == 5
    assert cartpole.work_unit(cartpole.prepare(), 0, seed=1).episodes == 5


def steps(probe: Probe, count: int) -> list[float]:
    """The losses of ``count`` steps of one build of ``probe``."""
    step = probe()

    async def run() -> list[float]:
        return [await step() for _ in range(count)]

    return run_to_completion(run())


def test_a_task_without_a_probe_says_so() -> None:
    assert Episodic().device_probe() is None


def test_the_language_model_probe_is_lm_step_on_the_initial_model() -> None:
    task = ArithTask({"batch_size": 4, "n_layer": 1, "n_embd": 32, "n_head": 2})
    probe = task.device_probe(seed=3)
    assert probe is not None
    got = steps(probe, 3)
    assert steps(probe, 3) == got  # every call builds a fresh copy from the same weights
    model = task.build_model(3)
    tokens = np.random.default_rng(3).integers(0, model.config.vocab_size, size=(4, model.config.context + 1))
    optimizer = Adam(model.parameters(), lr=1e-3)
    want = [lm_step(model, optimizer, tokens[:, :-1], tokens[:, 1:], clip=1.0, on_device=True).item()
            for _ in range(3)]
    assert got == want and got[2] < got[0]
    other = task.device_probe(seed=3, batch_size=2)
    assert other is not None and steps(other, 1) != got[:1]  # the batch_size option is used


class ReadCountingBackend(NumpyBackend):
    """numpy with WebGPU's read-back surface: blocking ``to_numpy`` and awaitable ``read``, both counted."""

    def __init__(self) -> None:
        super().__init__()
        self.blocking, self.awaited = 0, 0

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        self.blocking += 1
        return super().to_numpy(x)

    async def read(self, *arrays: np.ndarray) -> list[np.ndarray]:
        self.awaited += 1
        return [np.asarray(a) for a in arrays]


def test_the_async_lm_step_reads_back_once_and_clips_on_the_device() -> None:
    task = ArithTask({"batch_size": 4, "n_layer": 1, "n_embd": 32, "n_head": 2})
    probe = task.device_probe(seed=1)
    assert probe is not None
    backend = ReadCountingBackend()
    previous = set_backend(backend)
    try:
        step = probe()
        backend.blocking = 0  # building the model may read; the step itself must not block

        async def run() -> float:
            return await step()

        loss = run_to_completion(run())
    finally:
        set_backend(previous)
    assert np.isfinite(loss) and (backend.blocking, backend.awaited) == (0, 1)


def test_bytetext_has_the_language_model_probe() -> None:
    probe = ByteTextTask({"model": "bytelm-2.3mb"}).device_probe(batch_size=1)
    assert probe is not None
    losses = steps(probe, 2)
    assert all(np.isfinite(losses)) and losses[0] == pytest.approx(np.log(256), rel=0.1)


def test_the_cartpole_probe_is_a_policy_update_on_a_synthetic_batch() -> None:
    task = CartPoleTask()
    probe = task.device_probe(rows=64, seed=2)
    assert probe is not None
    got = steps(probe, 2)
    assert steps(probe, 2) == got and got[1] != got[0]
    policy = task.build_model(2)
    rng = np.random.default_rng(2)
    batch = PolicyBatch(rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 2, size=64),
                        rng.normal(size=64).astype(np.float32), np.full(64, np.log(0.5), np.float32))
    optimizer = Adam(policy.parameters(), lr=0.01)
    assert got == [update_policy(policy, optimizer, batch, clip_ratio=0.2) for _ in range(2)]


class FakeGPU(NumpyBackend):
    name = "webgpu"


@pytest.fixture
def numpy_as_webgpu(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """WebGPU replaced by a numpy backend; returns the messages posted to the page."""
    posted: list[dict[str, Any]] = []

    async def create_backend(navigator: Any = None) -> FakeGPU:
        return FakeGPU()

    monkeypatch.setattr(webgpu, "create_backend", create_backend)
    monkeypatch.setattr(webgpu, "post_to_page", posted.append)
    return posted


class FakePeer:
    def __init__(self, task: Task) -> None:
        self.task = task


def test_auto_times_the_tasks_own_probe(numpy_as_webgpu: list[dict[str, Any]]) -> None:
    built: list[dict[str, Any]] = []

    class Watched(CartPoleTask):
        def device_probe(self, *, seed: int = 0, **options: Any) -> Probe | None:
            built.append({"seed": seed, **options})
            return super().device_probe(seed=seed, rows=32)

    choice = json.loads(run_to_completion(device.choose_for_peer(FakePeer(Watched()), "auto", steps=1)))
    assert built == [{"seed": 0}]
    assert choice["reason"] == "faster of the two" and choice["cpu_ms"] > 0 and choice["webgpu_ms"] > 0
    assert numpy_as_webgpu[-1]["chosen"] == choice["chosen"]


def test_auto_without_a_probe_times_nothing(numpy_as_webgpu: list[dict[str, Any]]) -> None:
    choice = json.loads(run_to_completion(device.choose_for_peer(FakePeer(Episodic()), "auto")))
    assert choice["chosen"] == "webgpu" and choice["cpu_ms"] is None


def test_the_device_chooser_knows_no_task() -> None:
    source = (RUNTIME / "device.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert not {name for name in imported if name.startswith(("runtime.tasks", "runtime.models"))}
    assert "MLPPolicy" not in source and "cartpole" not in source.lower()


def test_respond_answers_prompts_for_the_page() -> None:
    """The page's "Try the model": arithmetic answers a problem, CartPole plays an episode, a task without the
    hook refuses with a message."""
    from runtime.tasks.base import TaskError
    from runtime.tasks.cartpole import CartPoleTask

    cartpole = CartPoleTask({})
    answer = cartpole.respond(cartpole.initial_weights(0), "7")
    assert len(answer["frames"]) >= 2 and answer["text"].startswith("episode seed 7: return ")
    assert int(answer["text"].rsplit(" ", 1)[1]) == len(answer["frames"]) - 1
    with pytest.raises(TaskError, match="episode seed"):
        cartpole.respond(cartpole.initial_weights(0), "seven")
    assert cartpole.describe()["respond_hint"] and cartpole.describe()["plot_metric"] == "greedy_return"

    class Quiet(CartPoleTask):
        respond = Task.respond  # the default: no answers

    with pytest.raises(TaskError, match="does not answer prompts"):
        Quiet({}).respond(cartpole.initial_weights(0), "1")


def test_arith_respond_writes_the_models_greedy_answer() -> None:
    from runtime.tasks.arith import ArithTask

    task = ArithTask({"tokenizer": "char", "n_layer": 1, "n_embd": 32})
    task.attach({})
    task.tokenizer = task.make_tokenizer([], None)
    weights = task.initial_weights(0)
    answer = task.respond(weights, "37+48")
    assert answer["prompt"] == "37+48=" and answer["text"].startswith("37+48=")
    assert task.describe()["plot_metric"] == "accuracy"
