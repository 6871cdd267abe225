"""Figures for sessions: a task's validation metric per round, one line per session.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_metric(series: Mapping[str, Sequence[float | None]], path: Path, *, metric: str, title: str = "",
                events: Mapping[str, Sequence[int]] | None = None, log_scale: bool = False) -> Path:
    """Write a PNG of ``series[label][r]`` = the metric after r rounds (r = 0 is the initial model).

    Missing or non-finite values leave gaps; ``events[label]`` marks rounds (after r rounds) with an x.
    """
    figure = Figure(figsize=(8, 4.8), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, values in series.items():
        ys = [math.nan if v is None or not math.isfinite(v) else float(v) for v in values]
        (line,) = axes.plot(range(len(ys)), ys, label=label, linewidth=1.4)
        for after in (events or {}).get(label, ()):
            if 0 <= after < len(ys):
                finite = [y for y in ys[: after + 1] if math.isfinite(y)]
                y = ys[after] if math.isfinite(ys[after]) else (finite[-1] if finite else 0.0)
                axes.plot([after], [y], marker="x", markersize=9, color=line.get_color())
    axes.set_xlabel("rounds completed")
    axes.set_ylabel(metric)
    if log_scale:
        axes.set_yscale("log")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path
