"""Task packages: everything a session needs, built once on the host into a folder.

Layout::

    manifest.json        task reference, settings, model config, weight spec, fingerprint, unit count
    assets.json          JSON assets peers need too (a tokenizer, say)
    chunks/00000.ptw     data tasks: one int32 array per work unit, in the wire codec's array format
    validation.npz       the held-out split (never sent to peers)
    initial.safetensors  the initial weights, drawn from the package seed

The fingerprint covers the task, its settings, the model spec and the data, so a result computed
for another package is refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from runtime import wire_arrays
from runtime.tasks import HostServices, Task, TaskData, load_task
from runtime.tasks.loader import BUILTIN_TASKS, check_task_data, dry_run, module_name_for_file, replayable
from runtime.weights import WeightSpec

FORMAT = 1


def host_services() -> HostServices:
    from server.session import bpe

    return HostServices(train_bpe=getattr(bpe, "train_for_task", None))


def task_import_ref(task_ref: str, task: Task) -> str:
    """How a peer imports the task: the module inside the runtime wheel or the task's own wheel."""
    if task_ref in BUILTIN_TASKS:
        return BUILTIN_TASKS[task_ref]
    location, _, _ = task_ref.partition(":")
    if location.endswith(".py") or "/" in location:
        return f"{module_name_for_file(Path(location))}:{type(task).__name__}"
    return f"{location}:{type(task).__name__}"


def fingerprint_of(manifest: dict[str, Any], data: TaskData) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps({k: manifest[k] for k in ("task", "settings", "model_config", "spec", "num_units")},
                             sort_keys=True).encode())
    for chunk in data.units or []:
        digest.update(np.ascontiguousarray(chunk).tobytes())
    for name in sorted(data.validation):
        digest.update(name.encode() + np.ascontiguousarray(data.validation[name]).tobytes())
    return digest.hexdigest()[:16]


TASK_FIELDS = ("task_import", "settings", "spec", "fingerprint", "kind", "model_config", "describe")


@dataclass
class Package:
    """A built package, loaded: the attached task, its data and initial weights."""

    path: Path
    manifest: dict[str, Any]
    task: Task
    data: TaskData
    initial_weights: np.ndarray

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["fingerprint"])

    @property
    def spec(self) -> WeightSpec:
        return WeightSpec.from_json(self.manifest["spec"])

    def task_description(self) -> dict[str, Any]:
        """What a peer needs to build the task (``GET /api/task``): import name, settings, spec, assets, wheel."""
        return {key: self.manifest[key] for key in TASK_FIELDS} | {"assets": self.data.assets,
                                                                    "wheel": self.manifest.get("wheel")}

    def chunk_bytes(self, index: int) -> bytes:
        """A data unit as the wire codec's array message, exactly as stored."""
        return (self.path / "chunks" / f"{index:05d}.ptw").read_bytes()

    @classmethod
    def load(cls, path: Path) -> Package:
        path = Path(path)
        manifest_path = path / "manifest.json"
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{path} is not a peertrain package (no manifest.json); build one with "
                                    "`peertrain package`")
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{path}: package format {manifest.get('format')} is not {FORMAT}")
        task = load_task(manifest["task"], manifest["settings"])
        assets = json.loads((path / "assets.json").read_text())
        task.attach(assets)
        units = None
        if manifest["kind"] == "data":
            units = [wire_arrays.decode_array((path / "chunks" / f"{i:05d}.ptw").read_bytes(), expect_dtype="int32")[1]
                     for i in range(manifest["num_units"])]
        with np.load(path / "validation.npz") as stored:
            validation = {name: stored[name] for name in stored.files}
        data = TaskData(num_units=manifest["num_units"], units=units, validation=validation, assets=assets)
        initial = load_file(str(path / "initial.safetensors"))["weights"]
        return cls(path=path, manifest=manifest, task=task, data=data, initial_weights=initial)


def build_package(task_ref: str, settings: dict[str, Any], out_dir: Path, *, seed: int = 0,
                  check: bool = True, log: Any = print) -> Package:
    """Prepare the task's data, check the task end to end (one unit, one validation), write the folder."""
    task = load_task(task_ref, settings)
    data = check_task_data(task, task.prepare(host_services()))
    task.attach(data.assets)
    replays = None
    if check:
        dry_run(task, data, seed=seed)
        replays = replayable(task, data, seed=seed) if task.kind != "local" else None  # (peers' own data: no replay)
        if replays is False:
            log(f"warning: task {task.name} is not replayable (unit 0 trained twice gave different weights); "
                "the relay cannot verify its results by replay")
    initial = task.initial_weights(seed)
    spec = task.spec()
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "task": task_ref,
        "task_import": task_import_ref(task_ref, task),
        "task_source": str(Path(task_ref.partition(":")[0]).resolve()) if task_ref.partition(":")[0].endswith(".py")
        else None,
        "settings": task.settings_json(),
        "model_config": task.model_config(),
        "spec": spec.to_json(),
        "kind": task.kind,
        "num_units": data.num_units,
        "seed": seed,
        "describe": task.describe(),
    }
    manifest["fingerprint"] = fingerprint_of(manifest, data)
    manifest["replayable"] = replays  # (after the fingerprint: a property of the code, not of the data)

    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "chunks").mkdir(parents=True)
    for index, chunk in enumerate(data.units or []):
        (staging / "chunks" / f"{index:05d}.ptw").write_bytes(wire_arrays.encode_array(chunk, meta={"unit": index}))
    np.savez(staging / "validation.npz", **data.validation)  # type: ignore[arg-type]
    save_file({"weights": initial}, str(staging / "initial.safetensors"))
    (staging / "assets.json").write_text(json.dumps(data.assets))
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.replace(out_dir)
    log(f"package {out_dir}: task {task.name}, {data.num_units} units, {spec.size} weights, "
        f"fingerprint {manifest['fingerprint']}")
    return Package.load(out_dir)
