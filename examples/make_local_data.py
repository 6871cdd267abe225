"""Sample files for the local tasks: one folder per peer, as ``--local-data`` takes them.

    python examples/make_local_data.py csv  --out examples/data/csv  [--peers 3] [--rows 400] [--seed 0]
    python examples/make_local_data.py text --out runs/text-data     [--peers 3] [--bytes 20000]

``csv`` writes ``OUT/peers/peer-N/rows.csv`` (features x1..x4 and a label 0-2: the sector of the angle of
(x1, x2), x3 and x4 are noise) with a different mix of labels per peer (a peer holds mostly one class, as
volunteers' data rarely looks alike), and ``OUT/validation.csv`` (balanced) for the host. ``text`` cuts CPython's
own help text (``pydoc_data.topics``) into ``OUT/peers/peer-N/part-M.txt``: a different share of it per peer.
The files in ``examples/data/csv`` were made by the first command with its defaults.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CLASSES = 3


def csv_rows(rng: np.random.Generator, count: int, weights: np.ndarray) -> list[str]:
    """``count`` rows whose labels follow ``weights`` (a share per class)."""
    rows: list[str] = []
    while len(rows) < count:
        x = rng.uniform(-2.0, 2.0, size=4)
        angle = (np.arctan2(x[1], x[0]) + np.pi) / (2 * np.pi)  # 0..1
        label = min(CLASSES - 1, int(angle * CLASSES))
        if rng.random() < weights[label] / weights.max():  # rejection sampling for the peer's label mix
            rows.append(",".join(f"{v:.4f}" for v in x) + f",{label}")
    return rows


def write_csv(out: Path, peers: int, rows: int, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    written = []
    header = "x1,x2,x3,x4,label"
    for peer in range(peers):
        mix = np.full(CLASSES, 0.2)
        mix[peer % CLASSES] = 0.6
        path = out / "peers" / f"peer-{peer + 1}" / "rows.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join([header, *csv_rows(rng, rows, mix)]) + "\n")
        written.append(path)
    validation = out / "validation.csv"
    validation.write_text("\n".join([header, *csv_rows(rng, rows, np.ones(CLASSES))]) + "\n")
    return [*written, validation]


def write_text(out: Path, peers: int, size: int, parts: int = 2) -> list[Path]:
    from pydoc_data.topics import topics

    corpus = "\n\n".join(topics[name] for name in sorted(topics)).encode()
    written = []
    for peer in range(peers):
        start = peer * size
        for part in range(parts):
            piece = corpus[start + part * size // parts: start + (part + 1) * size // parts]
            path = out / "peers" / f"peer-{peer + 1}" / f"part-{part + 1}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(piece.decode("utf-8", errors="ignore").encode())
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=("csv", "text"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--peers", type=int, default=3)
    parser.add_argument("--rows", type=int, default=400, help="csv: rows per peer and in the validation file")
    parser.add_argument("--bytes", type=int, default=20000, help="text: bytes per peer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paths = write_csv(args.out, args.peers, args.rows, args.seed) if args.kind == "csv" else \
        write_text(args.out, args.peers, args.bytes)
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
