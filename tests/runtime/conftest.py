"""Fixtures the runtime tests share (``coroutines.py`` and ``torch_oracle.py`` are plain helper modules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server.session.package import Package, build_package

REPO_ROOT = Path(__file__).resolve().parents[2]
# 4 chunks of 256 rows, 2 local epochs: a unit trains in milliseconds and still learns the majority.
SMALL_SETTINGS: dict[str, Any] = {"chunks": 4, "examples": 1024, "epochs": 2}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    """The majority example's small package (as ``tests/server``'s), built once per module."""
    return build_package(str(REPO_ROOT / "examples" / "majority_task.py"), SMALL_SETTINGS,
                         tmp_path_factory.mktemp("package") / "package", seed=0, log=lambda _: None)
