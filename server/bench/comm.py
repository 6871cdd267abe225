"""``peertrain bench comm``: what each result codec costs on the wire and in the final metric, in the simulator.

Per task and seed one package (the same initial weights and unit order for every codec); per codec one session of
``serve``'s round (``server.simulation.sweep_worker.train_session``: every result passed through the codec as a
peer's upload, error feedback per simulated peer). Printed per task: the bytes a peer uploads per unit (a real
result message of the codec: header and payload), the bytes a peer downloads per round (the float32 weights message,
or with a compressing codec the relay's chain of one step, ``runtime.deltas``), up + down per round per peer
against float32's (the anchor, same run), and the final validation metric (mean and spread over the seeds)
against float32's. ``--network`` runs the network half instead (Chromium peers behind shaped links against
loopback: ``server.bench.comm_network``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime import wire
from runtime.codec import CODECS
from runtime.codecs import DEFAULT_TOPK_FRACTION, Codec
from runtime.codecs import from_json as codec_from_json
from runtime.deltas import encode_chain
from server.bench import comm_network
from server.session.config import SessionConfig
from server.session.package import Package, build_package
from server.session.session import Session
from server.simulation.sweep_worker import train_session

TASKS: dict[str, dict[str, Any]] = {  # the sessions: bytetext k = 5 for 33 rounds; arith's demo session
    "bytetext": {"settings": {}, "participants": 5, "rounds": 33},
    "arith": {"settings": {"tokenizer": "char", "epochs": 3}, "participants": 3, "rounds": None},
}
QUICK = {"bytetext": {"rounds": 4}, "arith": {"rounds": 3}}


@dataclass
class Row:
    codec: str
    up_bytes: int  # one result message
    down_bytes: int  # one weights message
    metrics: list[float] = field(default_factory=list)
    shown: list[float] = field(default_factory=list)  # the task's plot metric where it has another (arith: accuracy)
    seconds: float = 0.0


def upload_bytes(package: Package, codec: Codec) -> int:
    """A result message's bytes in ``codec``, built as a peer builds it."""
    spec, weights = package.task.spec(), package.initial_weights
    header = wire.WireHeader(spec=spec, round=0, fingerprint=package.fingerprint, num_examples=1,
                             metrics={"loss": 1.0, "seconds": 1.0},
                             meta={"slot": 0, "unit_index": 0, "engine": "native-numpy"})
    if not codec.compresses:
        return len(wire.encode(weights, header))
    update = np.random.default_rng(0).standard_normal(spec.size).astype(np.float32)
    return len(wire.encode_update(codec.encode(update, 0), header, codec, wire.weights_digest(weights)))


def download_bytes(session: Session, package: Package) -> int:
    """What a peer that trained last round downloads for the next: the full weights message (codec none), or the
    relay's chain of one step (the session's last, as ``GET /api/weights/<digest>/from/<held>`` sends it)."""
    weights_message = wire.encode(session.weights, wire.WireHeader(spec=session.spec, round=session.round,
                                                                   fingerprint=package.fingerprint, num_examples=0))
    steps = session.downloads.log.steps
    if not session.downloads.active or not steps:
        return len(weights_message)
    chain = encode_chain(steps[-1:], spec=session.spec, fingerprint=package.fingerprint,
                         codec=session.downloads.codec, round_index=session.round)
    return min(len(chain), len(weights_message))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    comm_network.add_arguments(parser)
    parser.add_argument("--tasks", default="bytetext,arith", help="comma-separated tasks (default bytetext,arith)")
    parser.add_argument("--codecs", default=",".join(CODECS),
                        help=f"comma-separated codecs (default {','.join(CODECS)})")
    parser.add_argument("--topk-fraction", type=float, default=DEFAULT_TOPK_FRACTION,
                        help=f"topk's share of each block (default {DEFAULT_TOPK_FRACTION})")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0, 1, ... per codec (default 3)")
    parser.add_argument("--quick", action="store_true", help="a few rounds per session (a smoke run, not a figure)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")


def run(args: argparse.Namespace) -> int:
    if args.network:
        return comm_network.run_network(args)
    codecs = [codec_from_json({"name": name, "fraction": args.topk_fraction}) for name in args.codecs.split(",")]
    report: dict[str, Any] = {}
    for task in args.tasks.split(","):
        plan = {**TASKS[task], **(QUICK[task] if args.quick else {})}
        rows = {codec.name: Row(codec.name, 0, 0) for codec in codecs}
        metric = ""
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory(prefix="peertrain-comm-") as folder:
                package = build_package(task, dict(plan["settings"]), Path(folder) / "package", seed=seed,
                                        check=False, log=lambda _: None)
                metric = package.task.metric
                k = min(plan["participants"], package.data.num_units)
                rounds = plan["rounds"]
                passes = 3 if rounds is None else -(-rounds * k // package.data.num_units)
                for codec in codecs:
                    row = rows[codec.name]
                    row.up_bytes = upload_bytes(package, codec)
                    config = SessionConfig(participants=k, passes=passes, seed=seed, max_rounds=rounds,
                                           codec=codec.name, topk_fraction=args.topk_fraction)
                    started = time.perf_counter()
                    session = train_session(package, config, None)
                    row.seconds += time.perf_counter() - started
                    row.metrics.append(float(session.history[-1]["metrics"][metric]))
                    shown = getattr(package.task, "plot_metric", None) or metric
                    row.shown.append(float(session.history[-1]["metrics"].get(shown, float("nan"))))
                    row.down_bytes = download_bytes(session, package)
                    print(f"{task} seed {seed} {codec.name}: {len(session.history)} rounds of {k}, final {metric} "
                          f"{row.metrics[-1]:.4f} ({time.perf_counter() - started:.0f} s)", flush=True)
        report[task] = print_table(task, metric, rows, shown)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


def print_table(task: str, metric: str, rows: dict[str, Row], shown: str) -> dict[str, Any]:
    anchor = rows.get("none")
    other = f" | final {shown} (mean, min-max)" if shown != metric else ""
    print(f"\n{task}: bytes per peer (up: one result; down: one round's weights or step) and final {metric}")
    print(f"| codec | up bytes / unit | down bytes / round | up + down vs float32 | final {metric} (mean, min-max) "
          f"| vs float32{other} |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if other else ""))
    figures = {}
    for row in rows.values():
        mean = statistics.fmean(row.metrics)
        ratio = (anchor.up_bytes + anchor.down_bytes) / (row.up_bytes + row.down_bytes) if anchor else None
        versus = mean / statistics.fmean(anchor.metrics) if anchor else None
        extra = f" {statistics.fmean(row.shown):.4f} ({min(row.shown):.4f}-{max(row.shown):.4f}) |" if other else ""
        print(f"| {row.codec} | {row.up_bytes:,} | {row.down_bytes:,} | "
              f"{f'{ratio:.2f}x smaller' if ratio else '-'} | {mean:.4f} ({min(row.metrics):.4f}-"
              f"{max(row.metrics):.4f}) | {f'{versus:.4f}' if versus else '-'} |{extra}")
        figures[row.codec] = {"up_bytes": row.up_bytes, "down_bytes": row.down_bytes, "metrics": row.metrics,
                              shown: row.shown, "seconds": row.seconds}
    return figures
