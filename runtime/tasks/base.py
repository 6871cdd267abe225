"""The task interface: what a host application defines, and what every peer runs.

A task builds its model, cuts its work into units, trains one unit inside a peer, validates a model
on the host and renders a few human-readable samples. Two kinds:

- ``"data"``: the host cuts encoded data into chunks; a unit is one chunk (int32 array) and a seed.
- ``"experience"``: the task makes its own experience (e.g. plays episodes); a unit is an episode
  budget and a seed, and the same seed replays the same episodes exactly.
- ``"local"``: each peer trains on files it chose itself, which never leave it (``runtime.tasks.local``): the
  task reads a file's bytes into examples (``parse_local``, run in the peer), a unit is "train on your local data"
  with the round's weights and a seed, and the peer evaluates the weights it was handed on a seeded held-out share
  of its examples (``evaluate_local``: federated evaluation). The relay counts the peer's examples up to
  ``max_examples_per_unit`` and cannot replay such a unit.

Lifecycle. Host: ``task = TaskClass(settings)``, ``data = task.prepare(host)`` (chunks, validation
split, JSON assets such as a tokenizer), ``task.attach(data.assets)``; then per round ``validate`` and
``samples``. Peer: ``task = TaskClass(settings)``, ``task.attach(assets)``, ``train_unit(weights, unit)``.
Only ``settings``, ``assets``, the unit's data and the weights cross the peer boundary, and
``crosses_boundary()`` says so in words for the page.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from runtime.device_probe import Probe
from runtime.nn import Module
from runtime.weights import WeightSpec, flatten, spec_of, unflatten

TaskKind = Literal["data", "experience", "local"]


class TaskError(ValueError):
    """A task module or its output breaks the interface; the message names the problem."""


@dataclass(frozen=True)
class WorkUnit:
    """One assignment's work: a data chunk (data tasks), an episode budget (experience tasks), or a peer's own
    training examples (local tasks: ``data``, with its held-out share in ``held_out``, both made by the peer)."""

    index: int
    seed: int
    data: np.ndarray | None = None
    episodes: int = 0
    progress: float = 0.0  # rounds done / rounds planned when handed out: lets a task decay its step size
    held_out: np.ndarray | None = None  # local tasks: the peer's held-out examples (federated evaluation)


@dataclass
class UnitResult:
    """What a peer sends back: new flat float32 weights, how many examples they saw, local metrics."""

    weights: np.ndarray
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class TaskData:
    """What ``prepare`` makes on the host.

    ``units``: the chunks of a data task (each an int32 array), None for an experience task.
    ``num_units``: C, the number of work units per pass. ``validation``: named arrays kept on the host.
    ``assets``: JSON-able things peers need too (a tokenizer's vocabulary, say).
    """

    num_units: int
    units: list[np.ndarray] | None = None
    validation: dict[str, np.ndarray] = field(default_factory=dict)
    assets: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    """One human-readable line, marked right or wrong where the task can tell."""

    text: str
    ok: bool | None = None


@dataclass
class HostServices:
    """Host-only helpers a task may use in ``prepare`` (runtime code cannot import host libraries).

    ``train_bpe(texts, num_merges, *, glue_end_marker=True) -> runtime.data.tokenizer.Tokenizer`` trains a
    byte-pair tokenizer with Hugging Face ``tokenizers`` (``server.session.bpe.train_for_task``): ``texts`` are
    ``runtime.data.arith.Problem``s (written with the end marker glued into the text when ``glue_end_marker``,
    so merges can fuse it with the last digit) or ready-made training lines, used as they are.
    """

    train_bpe: Callable[..., Any] | None = None


class Task:
    """Base class with the shared machinery; subclasses fill in the task-specific methods."""

    name: ClassVar[str] = "task"
    kind: ClassVar[TaskKind] = "data"
    metric: ClassVar[str] = "val_loss"  # the validation metric plotted and watched for divergence
    higher_is_better: ClassVar[bool] = False
    plot_metric: ClassVar[str | None] = None  # what the page's chart shows first (default: ``metric``)
    # The relay checks results by training units again: |result - replay| <= replay_rtol * |replay - global|.
    # None: the relay's default (calibrated on the built-in tasks); a task whose training amplifies float
    # rounding differences between a browser and native CPython more than those may declare its own.
    replay_rtol: ClassVar[float | None] = None
    # Whether a unit trained on one engine and replayed on another (a browser's CPU, WebGPU, native numpy) stays
    # within the replay tolerance. False where they can part ways for good (a float rounding difference that flips
    # a discrete choice, as an action in an episode, or that Adam turns into whole steps on coordinates with
    # near-zero gradients). Such a task is still verified where the host replays on the browser's own engine
    # (Pyodide under Node, bit for bit): results from any other engine are then refused and pages train on the
    # CPU; with native replays only, it runs without replays. Every built-in task replays bit for bit on the
    # browser's engine (``peertrain bench replay``).
    replay_across_engines: ClassVar[bool] = True
    # How results (and the merged steps peers download) travel when a session says ``--codec auto`` (the default):
    # none (float32 weights), int8 or topk (``runtime.codec``). Chosen per task from ``peertrain bench comm``; a
    # task that declares nothing keeps float32. (topk falls back to int8 where replays or copies compare results.)
    default_codec: ClassVar[str] = "none"
    Settings: ClassVar[type] = dict  # a dataclass with JSON-able fields in subclasses

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = self.parse_settings(dict(settings or {}))
        self._model: Module | None = None
        self._spec: WeightSpec | None = None

    # -- settings -------------------------------------------------------------------------------
    @classmethod
    def parse_settings(cls, values: dict[str, Any]) -> Any:
        if cls.Settings is dict:
            return values
        known = {f.name for f in dataclasses.fields(cls.Settings)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TaskError(f"task {cls.name!r}: unknown setting(s) {unknown}; known: {sorted(known)}")
        try:
            settings = cls.Settings(**values)
        except (TypeError, ValueError) as error:
            raise TaskError(f"task {cls.name!r}: bad settings: {error}") from error
        return settings

    def settings_json(self) -> dict[str, Any]:
        if isinstance(self.settings, dict):
            return dict(self.settings)
        return json.loads(json.dumps(dataclasses.asdict(self.settings)))

    # -- to be provided by each task ------------------------------------------------------------
    def crosses_boundary(self) -> str:
        """Which data leaves the host for the peers, in words for the page."""
        raise NotImplementedError

    def model_config(self) -> dict[str, Any]:
        """The model's JSON config (after ``attach``, since a tokenizer may set the vocabulary)."""
        raise NotImplementedError

    def build_model(self, seed: int) -> Module:
        raise NotImplementedError

    def prepare(self, host: HostServices | None = None) -> TaskData:
        raise NotImplementedError

    def attach(self, assets: Mapping[str, Any]) -> None:
        """Restore what ``prepare`` made for peers (a tokenizer, say). Default: nothing to restore."""

    def train_unit(self, weights: np.ndarray, unit: WorkUnit) -> UnitResult:
        raise NotImplementedError

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        raise NotImplementedError

    def samples(self, weights: np.ndarray, validation: Mapping[str, np.ndarray], count: int = 6) -> list[Sample]:
        return []

    # The page's "Try the model": what a visitor's prompt gets from ``weights`` (runs in the browser's worker).
    respond_hint: ClassVar[str] = ""  # what to type, shown in the box (empty: the task answers no prompts)

    def respond(self, weights: np.ndarray, prompt: str) -> dict[str, Any]:
        """The model's answer to ``prompt`` as JSON: ``{"text": ...}`` for text, ``{"frames": [...]}`` for an
        episode the page draws. Default: this task does not answer prompts."""
        raise TaskError(f"task {self.name!r} does not answer prompts (it defines no respond)")

    def episodes_per_unit(self) -> int:
        """Experience tasks: the episode budget of one work unit (see ``work_unit``). Default 1; override it."""
        return 1

    # -- example counts the relay knows -----------------------------------------------------------
    # A result's weight in the merge is its example count. A peer could claim any count, so the relay never
    # takes the claim for what it can compute: a data unit counts ``unit_examples`` (from the package), an
    # experience unit counts the peer's report capped by ``max_examples_per_unit``; a claim above either is
    # refused (``num_examples_claim``).
    def unit_examples(self, unit: WorkUnit) -> int:
        """Data tasks: how many examples unit ``unit`` holds, counted as ``train_unit`` counts them (its
        ``num_examples`` must not exceed this). Default: the chunk's first axis (rows); override it when a
        chunk is stored flat or packs several arrays (``dry_run`` checks the two agree)."""
        if unit.data is None:
            raise TaskError(f"task {self.name!r}: unit {unit.index} has no data to count")
        return int(unit.data.shape[0]) if unit.data.ndim else 1

    def unit_flops(self, unit: WorkUnit, num_examples: int) -> float:
        """The training FLOPs of one unit as the relay counts them for a volunteer's credit, never as a peer claims:
        about 6 per weight per example a pass (a forward and a backward pass, Kaplan et al.'s rule), times the
        passes a unit makes (the task's ``epochs`` setting, else 1). ``num_examples`` is the relay's own count
        (``unit_examples``, or an experience unit's report capped by ``max_examples_per_unit``)."""
        epochs = getattr(self.settings, "epochs", 1)
        return 6.0 * self.spec().size * num_examples * max(1, int(epochs) if isinstance(epochs, int | float) else 1)

    def max_examples_per_unit(self) -> int | None:
        """Experience and local tasks: the most examples one unit can honestly report (e.g. episodes x the step
        limit, or the rows a local unit trains on at most); None (the default) means no cap is known, and the relay
        then caps nothing. Override it (a local task must: the relay cannot count a peer's own data)."""
        return None

    # -- local tasks: peers train on their own files (runtime.tasks.local) ---------------------------
    local_accept: ClassVar[str] = ""  # the page's file picker hint (an <input accept>), e.g. ".csv,text/csv"
    local_hint: ClassVar[str] = ""  # what files to choose, in words for the page
    local_holdout: ClassVar[float] = 0.2  # default share of a peer's examples held out for federated evaluation

    def parse_local(self, name: str, content: bytes) -> np.ndarray:
        """Local tasks: the training examples in one file a peer chose (its name and bytes), as an array with one
        example per row (first axis). Runs in the peer. Raise ``runtime.tasks.local.LocalDataError(name, reason,
        line)`` for a file it cannot use (bad encoding, a row with the wrong column count, an empty file): the page
        shows the message beside the file. A local task must define it (the loader refuses one that does not)."""
        raise TaskError(f"task {self.name!r} does not read local files (it defines no parse_local)")

    def combine_local(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Local tasks: one array of examples from the valid files' arrays, in file-name order. Default: joined
        along the first axis."""
        return np.concatenate(list(arrays), axis=0)

    def split_local(self, examples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Local tasks: (training, held-out) examples of a peer. Default: a seeded share ``local_holdout`` of the
        rows, drawn with seed 0, so a peer holds out the same examples every round (and the simulator the same as a
        browser); none when there are fewer than 5 rows."""
        count = int(examples.shape[0])
        held = int(round(self.local_holdout * count)) if count >= 5 else 0
        if held == 0:
            return examples, examples[:0]
        order = np.random.default_rng(0).permutation(count)
        return examples[np.sort(order[held:])], examples[np.sort(order[:held])]

    def evaluate_local(self, weights: np.ndarray, examples: np.ndarray) -> dict[str, float]:
        """Local tasks: the task's metrics of ``weights`` on a peer's held-out examples (federated evaluation; use
        the names ``validate`` uses). Default: none."""
        return {}

    def min_local_examples(self) -> int:
        """Local tasks: the fewest training examples a peer needs before it may train (a text model's context
        plus one byte, say). Default 1."""
        return 1

    def sample_local_files(self) -> list[tuple[str, bytes]]:
        """Local tasks: a small made-up file or two in the format ``parse_local`` reads, so that ``peertrain
        package`` can train one unit on the host before a session starts (the host never sees a peer's files).
        Default: none (the check then covers the model and validation only)."""
        return []

    def device_probe(self, *, seed: int = 0, **options: Any) -> Probe | None:
        """A probe of this task's own kind of update, for the device chooser (``runtime.device``): called with
        a backend active it builds the model, optimizer and a synthetic batch there and returns an awaitable step.
        ``seed`` seeds the model and the batch; ``options`` are task-specific sizes. Default None: no probe,
        so ``auto`` has nothing to time (``runtime.device.choose_device`` then takes WebGPU where present)."""
        return None

    # -- shared helpers ---------------------------------------------------------------------------
    def model(self) -> Module:
        """The task's model, built once per task object (weights are replaced by ``load``)."""
        if self._model is None:
            self._model = self.build_model(0)
            self._spec = spec_of(self._model.state_dict())
        return self._model

    def spec(self) -> WeightSpec:
        self.model()
        assert self._spec is not None
        return self._spec

    def initial_weights(self, seed: int) -> np.ndarray:
        model = self.build_model(seed)
        return flatten(model.state_dict(), spec_of(model.state_dict()))

    def load(self, weights: np.ndarray) -> Any:
        """The task's model holding ``weights`` (a flat float32 vector in spec order).

        Typed ``Any`` so a task can use its own model class's methods (``generate``, say) without casts.
        """
        model = self.model()
        spec = self.spec()
        if weights.shape != (spec.size,):
            raise TaskError(f"task {self.name!r}: weights have shape {weights.shape}, the model needs ({spec.size},)")
        model.load_state_dict(unflatten(np.asarray(weights, dtype=np.float32), spec, copy=True))
        return model

    def work_unit(self, data: TaskData, index: int, seed: int, progress: float = 0.0) -> WorkUnit:
        """Unit ``index`` of a pass, handed out with ``seed`` when ``progress`` of the session is done: a data
        task's unit is its chunk ``data.units[index]``; an experience task's is ``episodes_per_unit()`` episodes; a
        local task's holds no data on the host (each peer brings its own: ``runtime.tasks.local``)."""
        if self.kind == "local":
            return WorkUnit(index=index, seed=seed, progress=progress)
        if self.kind == "data":
            if data.units is None:
                raise TaskError(f"task {self.name!r}: a data task's TaskData has no units")
            return WorkUnit(index=index, seed=seed, data=data.units[index], progress=progress)
        return WorkUnit(index=index, seed=seed, episodes=self.episodes_per_unit(), progress=progress)

    def flat_weights(self, model: Module) -> np.ndarray:
        return flatten(model.state_dict(), self.spec())

    def describe(self) -> dict[str, Any]:
        """What the page shows about the session's task (a local task: what its file picker asks for)."""
        local = {"local": {"accept": self.local_accept, "hint": self.local_hint,
                           "max_examples_per_unit": self.max_examples_per_unit()}} if self.kind == "local" else {}
        return local | {
            "name": self.name,
            "kind": self.kind,
            "metric": self.metric,
            "plot_metric": self.plot_metric or self.metric,
            "higher_is_better": self.higher_is_better,
            "respond_hint": self.respond_hint,
            "crosses_boundary": self.crosses_boundary(),
            "settings": self.settings_json(),
        }


def check_unit_result(task: Task, result: Any, spec: WeightSpec) -> UnitResult:
    """Refuse a ``train_unit`` result that breaks the interface, naming what is wrong."""
    if not isinstance(result, UnitResult):
        raise TaskError(f"task {task.name!r}: train_unit returned {type(result).__name__}, expected UnitResult")
    weights = np.asarray(result.weights)
    if weights.dtype != np.float32 or weights.shape != (spec.size,):
        raise TaskError(
            f"task {task.name!r}: train_unit returned weights {weights.dtype}{list(weights.shape)}, "
            f"expected float32[{spec.size}]"
        )
    if not np.all(np.isfinite(weights)):
        raise TaskError(f"task {task.name!r}: train_unit returned non-finite weights")
    if not isinstance(result.num_examples, int | np.integer) or result.num_examples <= 0:
        raise TaskError(f"task {task.name!r}: train_unit returned num_examples={result.num_examples!r}, need > 0")
    return result


def batches(count: int, batch_size: int, rng: np.random.Generator) -> Sequence[np.ndarray]:
    """Shuffled index batches covering ``range(count)`` once (the last batch may be short)."""
    order = rng.permutation(count)
    return [order[start : start + batch_size] for start in range(0, count, batch_size)]
