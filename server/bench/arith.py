"""``peertrain bench tasks`` (arithmetic part): the BPE tokenizer pitfall on arithmetic
(digits glued to operators, the end marker swallowed), reproduced and fixed.

Both runs use the pitfall's data (``REPORT_ARITH_SEED``, ``REPORT_NUM_EXAMPLES`` problems, operands uniform over
0-99: ``REPORT_WIDTH_BALANCE``) and the same model and training settings; only the tokenizer differs: ``bpe``
(``REPORT_NUM_MERGES`` merges, the end marker glued into the text: the pitfall) and ``char`` (every character a
token, a real ``<eos>``: the fix). An epoch is one pass over every chunk, trained unit after unit (FedAvg with one
participant per round, so the merge is the identity). Printed per tokenizer: the inspection of how it cuts
``37+48=85``, then per epoch the seconds (wall and CPU), validation loss, exact answers x/200, generalisation
accuracy (held-out pairs and three-digit problems), and finally a few sample answers. The anchor is the bpe run:
the last lines print char against bpe, and the epoch time against a published ~4 s per epoch for this set-up.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.tasks.arith import ArithTask
from runtime.tasks.base import WorkUnit
from server.session.bpe import REPORT_ARITH_SEED, REPORT_NUM_EXAMPLES, REPORT_NUM_MERGES, REPORT_WIDTH_BALANCE
from server.session.package import host_services

REPORT_EPOCH_SECONDS = 4.0
REPORT_SETTINGS: dict[str, Any] = {"seed": REPORT_ARITH_SEED, "num_examples": REPORT_NUM_EXAMPLES,
                                   "width_balance": REPORT_WIDTH_BALANCE, "merges": REPORT_NUM_MERGES}


@dataclass
class ArithRun:
    tokenizer: str
    inspection: list[str]
    epochs: list[dict[str, float]] = field(default_factory=list)  # per epoch: seconds, cpu_seconds, metrics
    samples: list[str] = field(default_factory=list)

    @property
    def final(self) -> dict[str, float]:
        return self.epochs[-1]

    @property
    def seconds_per_epoch(self) -> float:
        return float(np.median([e["seconds"] for e in self.epochs]))


def train_sequentially(settings: dict[str, Any], *, epochs: int, seed: int = 0, target: float | None = None,
                       log: Any = print) -> ArithRun:
    """Prepare the task, then ``epochs`` passes over its chunks, one unit after the other, validating after
    each pass; stops early once the accuracy reaches ``target`` (when given)."""
    task = ArithTask(settings)
    data = task.prepare(host_services())
    task.attach(data.assets)
    assert data.units is not None
    run = ArithRun(tokenizer=task.settings.tokenizer, inspection=task.inspect_lines())
    weights = task.initial_weights(seed)
    for epoch in range(epochs):
        wall, cpu = time.perf_counter(), time.process_time()
        for index, chunk in enumerate(data.units):
            unit = WorkUnit(index=index, seed=seed * 1_000_003 + epoch * data.num_units + index, data=chunk,
                            progress=epoch / epochs)
            weights = task.train_unit(weights, unit).weights
        record = {"epoch": epoch + 1, "seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}
        record |= task.validate(weights, data.validation)
        total = len(data.validation["val_answers"])
        run.epochs.append(record)
        log(f"  epoch {epoch + 1:2d}  {record['seconds']:5.2f} s (cpu {record['cpu_seconds']:5.2f} s)  "
            f"val loss {record['val_loss']:.4f}  accuracy {int(record['correct'])}/{total}"
            f"  generalisation {record['generalization_accuracy']:.3f} (held-out pairs "
            f"{record['heldout_accuracy']:.3f}, beyond range {record['beyond_range_accuracy']:.3f})")
        if target is not None and record["accuracy"] >= target:
            break
    run.samples = [s.text for s in task.samples(weights, data.validation, count=6)]
    return run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arith-epochs", type=int, default=12, help="passes over the data per tokenizer")
    parser.add_argument("--arith-tokenizers", default="bpe,char", help="comma-separated: bpe, char")
    parser.add_argument("--arith-seed", type=int, default=0, help="initial weights and unit seeds")
    parser.add_argument("--arith-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an arith task setting for both runs (e.g. chunks=1)")
    parser.add_argument("--arith-target", type=float, default=0.99,
                        help="stop a run once its accuracy reaches this (0: run every epoch)")
    parser.add_argument("--arith-out", type=Path, default=None, help="write the figures as JSON here")


def run(args: argparse.Namespace) -> int:
    from server.cli.options import parse_sets

    settings = REPORT_SETTINGS | parse_sets(args.arith_set)
    runs: dict[str, ArithRun] = {}
    for name in [t.strip() for t in args.arith_tokenizers.split(",") if t.strip()]:
        print(f"arith, tokenizer={name}: {json.dumps(settings | {'tokenizer': name}, sort_keys=True)}")
        run_ = train_sequentially(settings | {"tokenizer": name}, epochs=args.arith_epochs, seed=args.arith_seed,
                                  target=args.arith_target or None, log=lambda line: print(line, flush=True))
        runs[name] = run_
        for line in run_.inspection:
            print(f"  {line}")
        final = run_.final
        print(f"  {name}: {final['epoch']} epochs, {run_.seconds_per_epoch:.2f} s per epoch, val loss "
              f"{final['val_loss']:.4f}, accuracy {int(final['correct'])}/200, generalisation "
              f"{final['generalization_accuracy']:.3f} (held-out {final['heldout_accuracy']:.3f}, beyond range "
              f"{final['beyond_range_accuracy']:.3f})")
        for sample in run_.samples:
            print(f"    {sample}")
    if "char" in runs:
        char = runs["char"]
        print(f"char epoch time vs the published ~{REPORT_EPOCH_SECONDS:.0f} s: "
              f"{char.seconds_per_epoch / REPORT_EPOCH_SECONDS:.2f}x")
    if "char" in runs and "bpe" in runs:
        char_final, bpe_final = runs["char"].final, runs["bpe"].final
        print(f"char vs bpe (anchor): accuracy {int(char_final['correct'])}/200 vs {int(bpe_final['correct'])}/200, "
              f"val loss {char_final['val_loss']:.4f} vs {bpe_final['val_loss']:.4f}, epoch time ratio "
              f"{runs['char'].seconds_per_epoch / runs['bpe'].seconds_per_epoch:.2f}")
    if args.arith_out is not None:
        args.arith_out.parent.mkdir(parents=True, exist_ok=True)
        args.arith_out.write_text(json.dumps({name: r.__dict__ for name, r in runs.items()}, indent=2))
    return 0
