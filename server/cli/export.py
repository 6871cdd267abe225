"""``peertrain export``: a session's model as named-tensor safetensors, or as a Hugging Face GPT-2 folder."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import httpx
import numpy as np

from server.session.export import FORMATS, ExportError, exported_weights, metadata_of, model_metadata, write_export

HELP = "write a session's model as safetensors (named tensors) or a Hugging Face GPT-2 folder"
DESCRIPTION = ("Reads the latest (or best) weights of a session folder, or of a running relay (its URL and the "
               "admin token), and writes them in a standard format. --format safetensors: model.safetensors with "
               "one tensor per parameter under the model's names and config.json (model config, task, "
               "tokenizer). --format hf (transformer tasks): config.json, model.safetensors in GPT-2's layout and "
               "tokenizer.json, which transformers.GPT2LMHeadModel.from_pretrained and "
               "PreTrainedTokenizerFast load.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a session folder (e.g. runs/session-arith) or a relay URL "
                        "(http://127.0.0.1:8000/)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument("--format", choices=FORMATS, default="safetensors", help="safetensors (default) or hf")
    parser.add_argument("--round", choices=("latest", "best"), default="latest",
                        help="the newest weights (default) or the best validated round's")
    parser.add_argument("--admin-token", default=os.environ.get("PEERTRAIN_ADMIN_TOKEN"),
                        help="for a relay URL: its admin token (env PEERTRAIN_ADMIN_TOKEN)")


def from_relay(url: str, token: str | None, which: str) -> bytes:
    if not token:
        raise ExportError("exporting from a relay needs its admin token (--admin-token or PEERTRAIN_ADMIN_TOKEN)")
    response = httpx.get(url.rstrip("/") + f"/api/admin/export/model?round={which}",
                         headers={"Authorization": f"Bearer {token}"}, timeout=120)
    if response.status_code != 200:
        raise ExportError(f"the relay refused the export: {response.status_code} {response.text[:200]}")
    return response.content


def from_folder(directory: Path, which: str) -> tuple[np.ndarray, dict[str, str]]:
    from server.session import checkpoint_files as checkpoint
    from server.session.package import Package
    from server.session.privacy import of_weights

    stored = checkpoint.read_session_config(directory)
    point = checkpoint.read_latest(directory) if which == "latest" else checkpoint.read_best(directory, repair=False)
    if point.spec is None:
        raise ExportError(f"{directory}: the checkpoint has no weight spec; it cannot be written with names")
    package = Package.load(Path(stored["package"])) if stored.get("package") else None
    if package is None:
        raise ExportError(f"{directory}: session.json names no package folder")
    rounds = int(point.state["round"])
    config = stored["config"]
    metadata = model_metadata(spec=point.spec, task_info=package.task_description(),
                              model_config=package.task.model_config(), round_index=rounds,
                              fingerprint=package.fingerprint,
                              privacy=of_weights(checkpoint.read_history(directory), rounds,
                                                 config.get("dp_noise_multiplier") is not None))
    return point.weights, metadata


def run(args: argparse.Namespace) -> int:
    try:
        if str(args.source).startswith(("http://", "https://")):
            blob = from_relay(args.source, args.admin_token, args.round)
            weights, metadata = exported_weights(blob), metadata_of(blob)
        else:
            weights, metadata = from_folder(Path(args.source), args.round)
        written = write_export(args.out, weights, metadata, args.format)
    except (ExportError, ValueError, OSError, httpx.HTTPError) as error:
        print(f"peertrain export: {error}", file=sys.stderr)
        return 2
    task = json.loads(metadata["task"]).get("task_import")
    print(f"exported round {metadata['round']} of {task} as {args.format}: " + ", ".join(str(p) for p in written))
    return 0
