"""``peertrain peers``: the URL each headless page opens, and what the command refuses before it starts a browser."""

from __future__ import annotations

import pytest

from server.browser.peers import join_url, run_peers


@pytest.mark.parametrize(("url", "workers", "expected"), [
    ("http://127.0.0.1:8000/", 0, "http://127.0.0.1:8000/?join=1"),
    ("http://127.0.0.1:8000/", 3, "http://127.0.0.1:8000/?join=1&workers=3"),
    ("http://127.0.0.1:8000/?code=x&join=0", 2, "http://127.0.0.1:8000/?code=x&join=0&workers=2"),
    ("http://127.0.0.1:8000", 1, "http://127.0.0.1:8000/?join=1&workers=1"),
])
def test_each_page_joins_with_the_workers_asked_for(url: str, workers: int, expected: str) -> None:
    assert join_url(url, workers) == expected


@pytest.mark.parametrize(("count", "workers"), [(0, 1), (2, -1)])
def test_bad_counts_are_refused_before_a_browser_starts(count: int, workers: int,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert run_peers(count, "http://127.0.0.1:9/", workers=workers) == 2
    assert "--workers 0 or more" in capsys.readouterr().err
