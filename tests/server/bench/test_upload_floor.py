"""The crowd's anchor (``server.bench.upload_floor``): a bare app on a real uvicorn, its uploads counted at both
ends."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from server.bench.upload_floor import main, measure


def test_the_stored_floor_keeps_every_upload_it_counts(tmp_path: Path) -> None:
    """Every upload the clients count as answered is a row in the app's SQLite file, of its size and sha256."""
    floor = measure(tmp_path, size=4096, clients=3, seconds=0.5)
    assert floor.uploads > 0 and floor.stored and floor.per_second == floor.uploads / floor.seconds
    assert floor.app_ms > 0 and floor.clients_ms > 0
    with sqlite3.connect(tmp_path / "floor.sqlite3") as db:
        rows = db.execute("SELECT COUNT(*), MIN(LENGTH(body)), MAX(LENGTH(body)), COUNT(DISTINCT sha256) FROM r"
                          ).fetchone()
    assert rows == (floor.uploads, 4096, 4096, 1)
    assert f"{floor.uploads} uploads of 4,096 bytes received, hashed and stored in SQLite" in floor.line()


def test_the_dropping_floor_stores_nothing_and_the_module_prints_both(tmp_path: Path, capsys) -> None:
    floor = measure(tmp_path, size=1000, clients=2, seconds=0.3, stored=False)
    assert floor.uploads > 0 and not (tmp_path / "floor.sqlite3").exists()
    main(["--clients", "2", "--seconds", "0.3", "--bytes", "2000"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2 clients uploading 2,000 bytes each, 0.3 s per app"
    assert "received and dropped" in lines[1] and "received, hashed and stored in SQLite" in lines[2]
