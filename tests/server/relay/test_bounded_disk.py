"""Bounded disk (``serve --keep-results N``): once a round is merged and checkpointed, the result messages of
rounds older than N are emptied and only their audit rows stay, so over a long session the SQLite file and
the session folder stop growing; the weights are those of a run that kept everything."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from relay_fixtures import (
    ADMIN_TOKEN,
    HttpPeer,
    make_relay,
    reference_run,
    run_round,
    serving,
    session_status,
)

from server.relay.store import Store, open_store
from server.session.package import Package
from server.session.session import SessionConfig

PASSES, ROUNDS = 25, 50  # 4 units, 2 a round
# The majority task's loss falls to ~1e-4, where noise trips the divergence watch's "3 x best": not the point here.
CONFIG = {"divergence_factor": 1e6}


def folder_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and "-wal" not in p.name
               and "-shm" not in p.name and not p.name.endswith(".sqlite3"))


def sizes_over_a_long_session(package: Package, directory: Path, keep: int | None) -> tuple[list[int], list[int],
                                                                                               Store, np.ndarray]:
    """(SQLite bytes after each round, session folder bytes after each round, the store, final weights)."""
    relay = make_relay(package, directory, k=2, passes=PASSES, keep_results=keep, verify_fraction=1.0,
                       config=CONFIG, undo_rounds=keep or 0)  # (a ban's undo keeps that many rounds' messages too)
    assert relay.session.num_rounds == ROUNDS
    sqlite, folder = [], []
    with serving(relay) as client:
        audit = client.get("/api/admin/export/results", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert audit.status_code == 200 and audit.text == ""  # nothing merged yet
        peers = [HttpPeer(client), HttpPeer(client)]
        while not session_status(client)["done"]:
            status = run_round(client, peers)
            sqlite.append(status["storage"]["sqlite_bytes"])
            folder.append(folder_bytes(directory))
            assert status["storage"]["sqlite_bytes"] == relay.store.disk_bytes()
        weights = relay.session.weights.copy()
        audit = client.get("/api/admin/export/results", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert [json.loads(line) for line in audit.text.splitlines()] == relay.store.audit()
        assert relay.session.stopped is None, relay.session.stopped
    return sqlite, folder, open_store(directory / "relay.sqlite3"), weights


def test_fifty_rounds_leave_the_sqlite_file_and_the_session_folder_flat(package: Package, tmp_path: Path) -> None:
    sqlite, folder, store, weights = sizes_over_a_long_session(package, tmp_path / "pruned", keep=2)
    try:
        assert len(sqlite) == ROUNDS
        # From round 10 on nothing grows but the history (one line per round, under 3 kB each).
        assert max(sqlite[10:]) <= max(sqlite[:10]), sqlite
        growth = [b - a for a, b in zip(folder[10:], folder[11:], strict=False)]
        assert max(growth) < 3000, growth
        audit = store.audit()
        assert len(audit) == 2 * ROUNDS
        kept = {row["round"] for row in audit if row["message_kept"]}
        assert kept == {ROUNDS - 2, ROUNDS - 1}  # the last two merged rounds, as asked
        assert all(len(row["sha256"]) == 64 and row["size"] > 0 and row["num_examples"] > 0 for row in audit)
        assert all(row["verification"].startswith("replay passed") for row in audit)  # (verify_fraction 1)
        # A kept message is the one the audit row describes.
        last = store.results(ROUNDS - 1)
        assert {hashlib.sha256(r.message).hexdigest() for r in last.values()} == \
            {row["sha256"] for row in audit if row["round"] == ROUNDS - 1}
    finally:
        store.close()
    expected = reference_run(package, SessionConfig(participants=2, passes=PASSES, **CONFIG))
    np.testing.assert_array_equal(weights, expected)


@pytest.mark.slow
def test_without_pruning_the_file_grows_with_every_round(package: Package, tmp_path: Path) -> None:
    """The anchor: keeping every message, the file grows by about one round of messages per round."""
    sqlite, _, store, _ = sizes_over_a_long_session(package, tmp_path / "kept", keep=None)
    try:
        per_round = sum(row["size"] for row in store.audit()) / ROUNDS
    finally:
        store.close()
    assert sqlite[-1] - sqlite[9] > 0.8 * per_round * (ROUNDS - 10), (sqlite[9], sqlite[-1], per_round)
