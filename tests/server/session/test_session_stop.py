"""An admin stop is recorded in the checkpoint: a restarted relay does not resume a stopped session."""

from __future__ import annotations

from pathlib import Path

from server.session.package import build_package
from server.session.session import Session, SessionConfig

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "majority_task.py"


def test_stop_survives_a_restart(tmp_path: Path) -> None:
    package = build_package(str(EXAMPLE), {"chunks": 2, "examples": 256, "epochs": 1}, tmp_path / "pkg",
                            log=lambda _: None)
    session = Session.create(package, SessionConfig(participants=2, passes=1), directory=tmp_path / "s")
    assert not session.done
    session.stop("stopped by the admin")
    restored = Session.restore(tmp_path / "s", package)
    assert restored.done and restored.stopped == "stopped by the admin"
    session.stop("a second reason is ignored")
    assert Session.restore(tmp_path / "s", package).stopped == "stopped by the admin"
