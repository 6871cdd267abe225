"""Session checkpoints as files: one folder per round, a ``latest`` pointer, the best round, the history.

(The relay's peers, leases and results live in the relay's store instead: ``server.relay.store``.)

Layout of a session directory::

    session.json                   the session's config (plan, merge, divergence watch) and package
    history.jsonl                  one JSON object per completed round
    rounds/000004/weights.safetensors      global weights after 4 rounds: one tensor per parameter under the
                                           model's names, spec in metadata (before: one flat ``weights``)
    rounds/000004/merge_state.safetensors  the merge method's arrays (FedAvgM's momentum, FedAdam's m and v)
    rounds/000004/state.json               the merge method's scalars and the session's counters
    best/...                       the same three files for the best round so far
    latest                         text: the folder of the newest complete checkpoint (``rounds/000004``)

A round's folder is written in full before ``latest`` moves to it (temp file + ``os.replace``), so a
crash leaves the previous checkpoint in force. ``history.jsonl`` may run ahead of ``latest`` after a
crash; ``state.json`` says how many lines belong to the checkpoint and a restore cuts the rest.
Arrays keep their dtype (float32 weights, float64 merge state), so a restore is bit-exact.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from runtime.merge import StateDict, join_state, split_state
from runtime.weights import WeightSpec
from server.session.downloads import split_download_state
from server.session.export import ExportError, flat_vector, named_tensors

SESSION_FILE = "session.json"
HISTORY_FILE = "history.jsonl"
LATEST_FILE = "latest"
ROUNDS_DIR = "rounds"
BEST_DIR = "best"
WEIGHTS_FILE = "weights.safetensors"
MERGE_STATE_FILE = "merge_state.safetensors"
STATE_FILE = "state.json"
FLAT_TENSOR = "weights"  # the one tensor of a checkpoint written before named tensors (or without a spec)


AGGREGATE_PREFIX = "aggregate."  # the aggregator's state shares the checkpoint's merge_state file


def join_server_state(merge: StateDict, aggregate: StateDict, downloads: StateDict) -> StateDict:
    """The server state a checkpoint keeps in its merge_state files: the merge method's, the aggregator's (prefixed)
    and the downloads' residual (``server.session.downloads``, prefixed by it)."""
    return {**merge, **{AGGREGATE_PREFIX + k: v for k, v in aggregate.items()}, **downloads}


def split_server_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's server state as (the merge method's, the aggregator's); the downloads' residual (topk) is
    neither's (``server.session.downloads.split_download_state``)."""
    state, _ = split_download_state(dict(state))
    merge = {k: v for k, v in state.items() if not k.startswith(AGGREGATE_PREFIX)}
    aggregate = {k.removeprefix(AGGREGATE_PREFIX): v for k, v in state.items() if k.startswith(AGGREGATE_PREFIX)}
    return merge, aggregate


class CheckpointError(ValueError):
    """A session directory is missing, incomplete or belongs to another package."""


@dataclass
class Checkpoint:
    """One stored point of a session: global weights, merge state, and the session's JSON state."""

    weights: np.ndarray
    spec: WeightSpec | None
    merge_state: StateDict
    state: dict[str, Any]


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats replaced by None, so every file stays standard JSON."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_text_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def write_session_config(directory: Path, config: Mapping[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / SESSION_FILE, json.dumps(json_safe(config), indent=2, sort_keys=True) + "\n")


def read_session_config(directory: Path) -> dict[str, Any]:
    path = Path(directory) / SESSION_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} holds no session ({SESSION_FILE} is missing)")
    return dict(json.loads(path.read_text()))


def write_point(folder: Path, checkpoint: Checkpoint, *, fingerprint: str) -> None:
    """Write one checkpoint folder (weights, merge arrays, JSON state) from scratch."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    metadata = {"fingerprint": fingerprint, "round": str(checkpoint.state.get("round", ""))}
    if checkpoint.spec is not None:  # one tensor per parameter, under the model's own names
        metadata["spec"] = json.dumps(checkpoint.spec.to_json())
        tensors = named_tensors(checkpoint.spec, checkpoint.weights)
    else:
        tensors = {FLAT_TENSOR: np.ascontiguousarray(checkpoint.weights)}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata=metadata)
    arrays, scalars = split_state(checkpoint.merge_state)
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(folder / MERGE_STATE_FILE))
    state = {**checkpoint.state, "merge_scalars": scalars}
    (folder / STATE_FILE).write_text(json.dumps(json_safe(state), indent=1, sort_keys=True) + "\n")


def read_point(folder: Path) -> Checkpoint:
    for name in (WEIGHTS_FILE, MERGE_STATE_FILE, STATE_FILE):
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder} is incomplete: {name} is missing")
    tensors = load_file(str(folder / WEIGHTS_FILE))
    with safe_open(str(folder / WEIGHTS_FILE), framework="np") as handle:
        metadata = handle.metadata() or {}
    spec = WeightSpec.from_json(json.loads(metadata["spec"])) if "spec" in metadata else None
    if FLAT_TENSOR in tensors:  # a checkpoint written before named tensors: one flat vector (still loads)
        weights = tensors[FLAT_TENSOR]
    elif spec is None:
        raise CheckpointError(f"checkpoint {folder} has named tensors but no spec in its metadata")
    else:
        try:
            weights = flat_vector(spec, tensors)
        except ExportError as error:
            raise CheckpointError(f"checkpoint {folder}: {error}") from error
    state = json.loads((folder / STATE_FILE).read_text())
    scalars = state.pop("merge_scalars", {})
    merge_state = join_state(load_file(str(folder / MERGE_STATE_FILE)), scalars)
    return Checkpoint(weights=weights, spec=spec, merge_state=merge_state, state=state)


def round_folder(directory: Path, rounds_done: int) -> Path:
    return directory / ROUNDS_DIR / f"{rounds_done:06d}"


def append_history(directory: Path, entries: Iterable[Mapping[str, Any]]) -> None:
    with (directory / HISTORY_FILE).open("a") as handle:
        for entry in entries:
            handle.write(json.dumps(json_safe(entry), sort_keys=True) + "\n")


def read_history(directory: Path, limit: int | None = None) -> list[dict[str, Any]]:
    path = Path(directory) / HISTORY_FILE
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines[:limit]]


def history_lines(directory: Path) -> int:
    """How many entries ``history.jsonl`` holds (0 when there is none)."""
    path = Path(directory) / HISTORY_FILE
    if not path.is_file():
        return 0
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def rewrite_history(directory: Path, history: Iterable[Mapping[str, Any]]) -> None:
    lines = "".join(json.dumps(json_safe(entry), sort_keys=True) + "\n" for entry in history)
    write_text_atomic(directory / HISTORY_FILE, lines)


def save_round(directory: Path, checkpoint: Checkpoint, *, fingerprint: str, new_history: Iterable[Mapping[str, Any]],
               best: Checkpoint | None = None, keep: int = 2) -> Path:
    """Store the state after ``checkpoint.state['round']`` rounds and point ``latest`` at it.

    Order matters for crash safety: the round folder, the best folder (when it changed), the history
    lines, then the pointer. ``keep`` round folders are kept (older ones are removed).
    """
    directory = Path(directory)
    folder = round_folder(directory, int(checkpoint.state["round"]))
    write_point(folder, checkpoint, fingerprint=fingerprint)
    if best is not None:
        write_best(directory, best, fingerprint=fingerprint)
    append_history(directory, new_history)
    point_latest(directory, folder)
    kept = sorted((directory / ROUNDS_DIR).iterdir())
    for old in kept[:-keep] if keep > 0 else []:
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    return folder


def write_best(directory: Path, best: Checkpoint, *, fingerprint: str) -> None:
    """The best round's folder: staged in full, then swapped in by renames (a crash between them: see read_best)."""
    staging, previous = directory / (BEST_DIR + ".partial"), directory / (BEST_DIR + ".old")
    write_point(staging, best, fingerprint=fingerprint)
    shutil.rmtree(previous, ignore_errors=True)
    if (directory / BEST_DIR).exists():
        os.replace(directory / BEST_DIR, previous)
    os.replace(staging, directory / BEST_DIR)
    shutil.rmtree(previous, ignore_errors=True)


def point_latest(directory: Path, folder: Path) -> None:
    write_text_atomic(directory / LATEST_FILE, folder.relative_to(directory).as_posix() + "\n")


def latest_folder(directory: Path) -> Path:
    pointer = Path(directory) / LATEST_FILE
    if not pointer.is_file():
        raise CheckpointError(f"{directory} has no checkpoint yet ({LATEST_FILE} is missing)")
    return Path(directory) / pointer.read_text().strip()


def read_latest(directory: Path) -> Checkpoint:
    return read_point(latest_folder(directory))


def read_best(directory: Path, *, repair: bool = True) -> Checkpoint:
    """The best checkpoint. Between the two renames of ``write_best`` only the previous best is on disk: it is the one
    the latest checkpoint knows (latest moves last), so it is read, and with ``repair`` moved back into place (a
    writer killed there). A reader beside a live writer (a relay following the one that holds the session, an export)
    never repairs: the writer's second rename would find the folder taken."""
    folder, previous = Path(directory) / BEST_DIR, Path(directory) / (BEST_DIR + ".old")
    if not folder.is_dir() and previous.is_dir():
        if not repair:
            return read_point(previous)
        os.replace(previous, folder)
    if not folder.is_dir():
        raise CheckpointError(f"{directory} has no best checkpoint ({BEST_DIR}/ is missing)")
    return read_point(folder)


# -- rewinding to an earlier round (a ban's undo, server.relay.undo) ------------------------------------------------
UNDONE_DIR = "undone"  # the checkpoints and history a rewind replaced, kept until their rounds are merged again


def best_as_of(directory: Path, point: Checkpoint, initial: np.ndarray) -> np.ndarray:
    """The best weights as ``point`` knew them: the initial weights (never beaten), best/ when it is still that best,
    the round folder of that best, or, where none of them is on disk any more, ``point``'s own weights."""
    best_round = point.state.get("best_round")
    if best_round is None:
        return np.asarray(initial, dtype=np.float32)
    try:
        best = read_best(directory)
        if best.state.get("best_round") == best_round and best.state.get("round", 0) <= point.state["round"]:
            return best.weights
    except CheckpointError:
        pass
    folder = round_folder(directory, int(best_round) + 1)
    return read_point(folder).weights if folder.is_dir() else point.weights


def rewind_files(directory: Path, best: Checkpoint, *, history: list[dict[str, Any]], kept: list[dict[str, Any]],
                 fingerprint: str) -> None:
    """Move a session's files back to round ``best.state["round"]`` (``Session.rewind``), in an order a crash can
    interrupt anywhere: the history as it was is set aside, best/ becomes the best as of then (``best``), ``latest``
    points at that round, the history is cut to ``kept``, and the later round folders move aside. Calling it again
    after a crash finishes what is left."""
    rounds_done = int(best.state["round"])
    keep_history_aside(directory, history)
    write_best(directory, best, fingerprint=fingerprint)
    point_latest(directory, round_folder(directory, rounds_done))
    rewrite_history(directory, kept)
    set_aside(directory, rounds_done)


def keep_history_aside(directory: Path, history: list[dict[str, Any]]) -> None:
    """Before a rewind: the history as it was goes to ``undone/`` (once: a second call after a crash keeps it)."""
    aside = directory / UNDONE_DIR
    aside.mkdir(exist_ok=True)
    if not (aside / HISTORY_FILE).is_file():
        rewrite_history(aside, history)


def set_aside(directory: Path, rounds_done: int) -> None:
    """After ``latest`` moved back to ``rounds_done``: the later round folders (the weights the later results were
    trained from) move to ``undone/``, until their rounds are merged again. A second call after a crash moves what
    is left."""
    aside = directory / UNDONE_DIR / ROUNDS_DIR
    aside.mkdir(parents=True, exist_ok=True)
    for folder in sorted((directory / ROUNDS_DIR).iterdir()):
        if folder.name.isdigit() and int(folder.name) > rounds_done:
            if (aside / folder.name).exists():
                shutil.rmtree(folder)  # (one an interrupted merge began again: the original is aside)
            else:
                os.replace(folder, aside / folder.name)


def set_aside_weights(directory: Path, rounds_done: int) -> np.ndarray | None:
    """The weights after ``rounds_done`` rounds as they were before the rewind (None: not set aside)."""
    folder = directory / UNDONE_DIR / ROUNDS_DIR / f"{rounds_done:06d}"
    return read_point(folder).weights if folder.is_dir() else None


def set_aside_history(directory: Path) -> list[dict[str, Any]]:
    return read_history(directory / UNDONE_DIR)


def discard_set_aside(directory: Path) -> None:
    shutil.rmtree(directory / UNDONE_DIR, ignore_errors=True)


def session_settings(session: Any) -> dict[str, Any]:
    """A session's (``server.session.session.Session``) settings as its folder's ``session.json`` keeps them (and a
    metrics run's params: ``server.session.metrics``)."""
    package_path = getattr(session.package, "path", None)
    return {
        "config": session.config.to_json(),  # (codec auto resolved to the task's)
        "package": str(Path(package_path).resolve()) if package_path is not None else None,
        "fingerprint": session.package.fingerprint,
        "task": session.task.describe(),
        "plan": session.plan.to_json(),
        "num_rounds": session.num_rounds,
    }


def session_state(session: Any) -> dict[str, Any]:
    """A session's (``server.session.session.Session``) state as its checkpoint's JSON keeps it."""
    return {
        "round": session.round,
        "initial_metrics": session.initial_metrics,
        "best_metric": session.best_metric,
        "best_round": session.best_round,
        "stopped": session.stopped,
        "checkpoint_id": session.checkpoint_id,
        "history_length": len(session.history),
        "consumed": session.consumed,
        "carried": [list(c) for c in session.carried],
        "merge": session.merge.name,
        "merge_config": session.merge.to_config(),
        "aggregate": session.aggregator.name,
        "aggregate_config": session.aggregator.to_config(),
        **({"privacy": session.privacy.state_json()} if session.privacy else {}),
    }


def save_session(session: Any, *, new_entries: list[dict[str, Any]], best_changed: bool) -> None:
    """Write a session's checkpoint after a round (its new history entries; the best weights too when they
    changed), first rewriting a history a checkpoint that failed to finish left longer."""
    assert session.directory is not None
    session.checkpoint_id = secrets.token_hex(8)  # (names this checkpoint: a ban's undo may merge a round again)
    state = session_state(session)
    server_state = join_server_state(session.merge.state_dict(), session.aggregator.state_dict(),
                                     session.downloads.state_dict())
    current = Checkpoint(session.weights, session.spec, server_state, state)
    best = Checkpoint(session.best_weights, session.spec, server_state, state) if best_changed else None
    before = session.history[:len(session.history) - len(new_entries)]
    if history_lines(session.directory) != len(before):  # lines of a checkpoint that failed to finish
        rewrite_history(session.directory, before)
    save_round(session.directory, current, fingerprint=session.package.fingerprint, new_history=new_entries,
               best=best, keep=session.checkpoints_kept)
