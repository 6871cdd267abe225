"""A short ``peertrain bench load``: 20 peers and 20 page watchers for 30 s against a real relay, with slow clients.

Nothing may get lost under load (every unit handed out in a merged round is in that round's merged units, the
history has no gap), no request may get a 5xx or a broken connection, and the slow clients must be cut off at
the relay's deadlines while the round goes on without them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from server.bench.load import EXAMPLES, LoadSettings, report, run_load
from server.relay.app import RelayPaths


@pytest.mark.slow
@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
def test_a_short_load_loses_no_unit_and_answers_no_5xx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the bench's trainer imports majority_task as the relay does
    settings = LoadSettings(peers=20, watchers=20, minutes=0.5, k=5, unit_seconds=1.0, anchor_units=5,
                            tricklers=1, silent=2, head_tricklers=1, body_timeout=4.0, header_timeout=3.0,
                            warm_up=6.0)
    figures = run_load(settings, tmp_path)
    print("\n".join(report(figures, settings)))

    assert figures.units_lost == 0 and figures.history_gaps == 0 and figures.history_missing == 0
    assert figures.five_xx == 0 and figures.transport_errors == 0, figures.answers
    assert figures.rounds >= 3 and figures.units_uploaded > 0
    assert not figures.watchers["failures"] and figures.watchers["events"] > 0
    assert len(figures.rss) >= 20 and all(math.isfinite(mb) for _, mb in figures.rss)

    slow = figures.slow
    assert slow["trickled"] and set(slow["trickled"]) == {"408 body_timeout"}, slow["trickled"]
    assert slow["trickle_seconds"]["max"] < settings.body_timeout + 5
    assert slow["trickled_units_merged"] == slow["trickled_units"]  # another peer's result took each unit
    assert slow["silent_closed"]["n"] > 0 and slow["silent_never_closed"] == 0
    assert slow["silent_closed"]["max"] < settings.header_timeout + 5
    assert set(slow["heads"]) == {"408 header_timeout"}, slow["heads"]
    assert figures.refusals.get("body_timeout", 0) >= 1 and figures.refusals.get("header_timeout", 0) >= 1
