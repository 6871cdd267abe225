"""What a history entry and a session's settings become in a metrics sink: flat keys joined by ``/``.

``scalars`` keeps every number of a round's entry (booleans and lists are not metrics; ``round`` is the step and
``time`` the wall time every point carries anyway); ``settings`` flattens ``session.json`` into text values, the form
MLflow's params take. A key keeps only the characters MLflow allows in a name (letters, digits, ``_ - . / :`` and
spaces; the rest become ``_``), so the same key names a series in both tools.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

STEP_KEY = "round"  # an entry's round: the step of its points
TIME_KEY = "time"  # its wall time (time.time() when it merged)
NOT_SCALARS = frozenset({STEP_KEY, TIME_KEY})
UNDONE = "undone"  # the scalar marking rounds a ban's undo set aside (server.session.metrics, the package docstring)

_NAME_CHARACTERS = re.compile(r"[^\w.\-/: ]")


def metric_key(parts: tuple[str, ...]) -> str:
    """``("metrics", "val_loss")`` -> ``metrics/val_loss``, with characters MLflow refuses replaced."""
    return _NAME_CHARACTERS.sub("_", "/".join(str(p) for p in parts))


def step(entry: Mapping[str, Any]) -> int:
    return int(entry[STEP_KEY])


def wall_time(entry: Mapping[str, Any]) -> float:
    return float(entry[TIME_KEY])


def scalars(entry: Mapping[str, Any]) -> dict[str, float]:
    """Every finite number of ``entry`` (nested dicts flattened), by key."""
    return {metric_key(path): value for path, value in _numbers(entry, ()) if path[0] not in NOT_SCALARS}


def _numbers(value: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], float]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers(item, (*path, str(key)))
    elif isinstance(value, int | float) and not isinstance(value, bool) and path and math.isfinite(value):
        yield path, float(value)


def settings(config: Mapping[str, Any]) -> dict[str, str]:
    """A session's settings (``session.json``) as flat text values: nested tables joined by ``/``, lists and None as
    JSON."""
    flat: dict[str, str] = {}

    def add(value: Any, path: tuple[str, ...]) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                add(item, (*path, str(key)))
        elif path:
            flat[metric_key(path)] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    add(config, ())
    return flat


def settings_table(flat: Mapping[str, str]) -> str:
    """The settings as a Markdown table (TensorBoard's text summaries render Markdown)."""
    rows = ["| setting | value |", "| --- | --- |"]
    rows += [f"| {key} | {value.replace('|', '\\|').replace(chr(10), ' ')} |" for key, value in sorted(flat.items())]
    return "\n".join(rows)
