"""Fixtures for every folder of tests (each folder's conftest.py holds its own; plain helpers are modules beside
the tests that use them, never test modules: tests/test_shape.py holds that rule)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def majority_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``examples/`` on sys.path for this test: native peers import ``majority_task`` as a relay started with
    ``--task majority_task:MajorityTask`` (and PYTHONPATH=examples) does."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
