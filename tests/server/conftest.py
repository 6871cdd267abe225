"""Fixtures the relay tests share (plain helpers are in ``relay_fixtures.py`` and ``relay_process.py``;
``majority_importable`` is in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
from relay_fixtures import build_small_package

from server.session.package import Package


@pytest.fixture(scope="module")
def package_settings() -> dict[str, Any]:
    """Settings of the ``package`` fixture over ``relay_fixtures.SMALL_SETTINGS``; a module overrides this fixture
    to build its package otherwise (``{"examples": 1536, "chunks": 6}``: six units)."""
    return {}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory, package_settings: dict[str, Any]) -> Package:
    """The majority example's small package, built once per module (4 chunks of 256 rows unless the module's
    ``package_settings`` say otherwise). Relays made on it keep their sessions in the test's own folder."""
    return build_small_package(tmp_path_factory.mktemp("package"), **package_settings)
