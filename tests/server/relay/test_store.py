"""The relay's SQLite store: peer tokens and the last-seen clock that decides who counts as connected."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from server.relay import sqlite_store as store_module
from server.relay.sqlite_store import Store


def last_seen(path: Path, peer_id: str) -> float:
    with sqlite3.connect(path) as db:
        return float(db.execute("SELECT last_seen FROM peers WHERE id = ?", (peer_id,)).fetchone()[0])


def test_tokens_are_checked_and_last_seen_is_written_at_most_once_per_resolution(tmp_path: Path) -> None:
    clock = [1000.0]
    path = tmp_path / "relay.sqlite3"
    store = Store(path, clock=lambda: clock[0])
    try:
        peer_id, token = store.add_peer("test")
        assert store.authenticate(peer_id, token)
        assert not store.authenticate(peer_id, token + "x")
        assert not store.authenticate("p-nobody", token)
        clock[0] += store_module.LAST_SEEN_RESOLUTION / 2
        assert store.authenticate(peer_id, token)
        assert last_seen(path, peer_id) == 1000.0  # a synced write per request would be wasted here
        clock[0] += store_module.LAST_SEEN_RESOLUTION
        assert store.authenticate(peer_id, token)
        assert last_seen(path, peer_id) == clock[0]
        clock[0] += 29.0
        assert store.active_peers(30.0) == [peer_id]
        clock[0] += 2.0
        assert store.active_peers(30.0) == []
        assert not store.authenticate(peer_id, "wrong")
        assert store.active_peers(30.0) == []  # a wrong token does not count as being seen
    finally:
        store.close()
