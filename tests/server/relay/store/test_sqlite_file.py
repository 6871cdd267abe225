"""What only the SQLite store has: its file. A file written by an older relay opens with its data; a call that
writes twice lands whole or not at all; a simulation's file skips syncing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from virtual_clock import Clock

from server.relay.store import LAST_SEEN_RESOLUTION, StoredResult, open_store
from server.relay.store.sqlite import SQLiteStore
from server.relay.store.sqlite.schema import SCHEMA

# The tables as the first files had them: no address, no audit columns, leases without second copies.
FIRST_FILES = """
CREATE TABLE peers (id TEXT PRIMARY KEY, token_hash TEXT NOT NULL, joined REAL NOT NULL, last_seen REAL NOT NULL,
    agent TEXT NOT NULL DEFAULT '', units_done INTEGER NOT NULL DEFAULT 0);
CREATE TABLE leases (round INTEGER NOT NULL, slot INTEGER NOT NULL, unit_index INTEGER NOT NULL,
    peer_id TEXT NOT NULL, issued REAL NOT NULL, deadline REAL NOT NULL, PRIMARY KEY (round, slot));
CREATE TABLE results (round INTEGER NOT NULL, slot INTEGER NOT NULL, unit_index INTEGER NOT NULL,
    peer_id TEXT NOT NULL, num_examples INTEGER NOT NULL, metrics TEXT NOT NULL, message BLOB NOT NULL,
    received REAL NOT NULL, PRIMARY KEY (round, slot));
INSERT INTO peers VALUES ('p-old', 'hash', 1.0, 2.0, 'agent', 3);
INSERT INTO leases VALUES (0, 1, 1, 'p-old', 1.0, 99.0);
INSERT INTO results VALUES (0, 0, 0, 'p-old', 256, '{"loss": 1.5}', X'0102', 5.0);
"""


def table_columns(path: Path) -> dict[str, list[str]]:
    with sqlite3.connect(path) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {table: [row[1] for row in db.execute(f"PRAGMA table_info({table})")] for table in tables}


def test_a_file_of_the_first_relays_opens_with_its_data(tmp_path: Path) -> None:
    old, new = tmp_path / "old.sqlite3", tmp_path / "new.sqlite3"
    with sqlite3.connect(old) as db:
        db.executescript(FIRST_FILES)
    with sqlite3.connect(new) as db:
        db.executescript(SCHEMA)
    store = open_store(old)
    try:
        assert store.results(0) == {0: StoredResult(0, 0, 0, "p-old", 256, {"loss": 1.5}, b"\x01\x02")}
        assert store.peer_address("p-old") == "" and store.peers_listing()[0]["units_done"] == 3
        assert store.leases(0) == {}  # (from before second copies: handed out again anyway)
        assert store.audit()[0]["sha256"] == "" and store.audit()[0]["verification"] == "not checked"
        store.grant(0, 1, 1, "p-new", 10.0, copy=1)
    finally:
        store.close()
    assert {table: sorted(columns) for table, columns in table_columns(old).items() if table != "sqlite_sequence"} \
        == {table: sorted(columns) for table, columns in table_columns(new).items() if table != "sqlite_sequence"}


def test_a_call_that_writes_twice_lands_whole_or_not_at_all(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "relay.sqlite3")
    try:
        with pytest.raises(RuntimeError), store.connection.transaction() as db:
            db.execute("INSERT INTO counters VALUES ('half', 1)")
            raise RuntimeError("the process died here")
        assert store.counters() == {}
        store.count("whole")  # (the connection is usable after a rollback)
        assert store.counters() == {"whole": 1}
    finally:
        store.close()


def test_a_simulations_file_is_not_synced_and_a_sessions_is(tmp_path: Path) -> None:
    for durable, expected in ((True, 1), (False, 0)):  # PRAGMA synchronous: 1 NORMAL, 0 OFF
        store = SQLiteStore(tmp_path / f"{durable}.sqlite3", durable=durable)
        try:
            assert store.connection.db.execute("PRAGMA synchronous").fetchone()[0] == expected
            store.add_result(StoredResult(0, 0, 3, "p-a", 256, {}, bytes(1 << 16)))
            assert store.disk_bytes() > 1 << 16  # (the file and its write-ahead log)
        finally:
            store.close()


def test_emptying_a_message_does_not_write_its_pages_again(tmp_path: Path) -> None:
    """Pruning a merged result frees its message's pages without overwriting them with zeros (Debian's SQLite
    overwrites by default: a 585 KB message written twice, under the lock every request waits on)."""
    store = SQLiteStore(tmp_path / "relay.sqlite3")
    try:
        db = store.connection.db
        assert db.execute("PRAGMA secure_delete").fetchone()[0] == 2  # FAST
        store.add_result(StoredResult(0, 0, 3, "p-a", 256, {}, bytes(1 << 20)))
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        db.execute("UPDATE results SET message = x'' WHERE round = 0")
        frames = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        assert 0 < frames < 16, f"emptying a 1 MiB message wrote {frames} pages"  # (256 pages of 4 KiB were it zeroed)
    finally:
        store.close()


def test_an_older_files_arrivals_open_with_their_messages_beside_them(tmp_path: Path) -> None:
    """A relay before ``arrival_messages`` kept each arrival's message in its row: on open they move beside the rows
    (a merged one's too, a pruned one stays without), and the buffer, the replay and the audit read them there."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA.split("-- An arrival's message")[0])  # (the tables up to the arrivals')
        for seq, merge, message in ((1, 0, b""), (2, 0, b"merged"), (3, None, b"waiting")):
            db.execute("INSERT INTO arrivals (seq, entry, unit_index, peer_id, version, num_examples, metrics, "
                       "message, update_vector, received, merge) VALUES (?, ?, ?, 'p-old', 0, 8, '{}', ?, ?, 1.0, ?)",
                       (seq, seq, seq, message, message[:2], merge))
    store = open_store(path)
    try:
        assert [(a[0], a[7], a[6]) for a in store.buffered()] == [(3, b"waiting", b"wa")]
        assert [(a[0], a[7]) for a in store.arrivals()] == [(1, b""), (2, b"merged")]
        assert [row["message_kept"] for row in store.audit()] == [False, True]
        assert store.prune_arrivals_before(1) == 1 and [a[7] for a in store.arrivals()] == [b"", b""]
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM arrivals WHERE length(message) > 0 OR length(update_vector) > 0"
                          ).fetchone()[0] == 0


def test_an_arrivals_row_holds_no_message(tmp_path: Path) -> None:
    """Marking a merge's hundred arrivals merged read each row through its message's overflow pages (SQLite reads a
    row's columns in order): 167 ms a merge under the lock every request waits on. The rows hold no message now."""
    store = SQLiteStore(tmp_path / "relay.sqlite3")
    try:
        seq = store.add_arrival(entry=0, unit_index=0, peer_id="p-a", version=0, num_examples=8, metrics={},
                                message=bytes(1 << 20), update=b"u")
        store.mark_merged([seq], 0)
        db = store.connection.db
        assert db.execute("SELECT length(message), length(update_vector) FROM arrivals").fetchall() == [(0, 0)]
        assert db.execute("SELECT seq, length(message), update_vector FROM arrival_messages").fetchall() == \
            [(seq, 1 << 20, b"u")]
        assert store.arrivals()[0][7] == bytes(1 << 20)
    finally:
        store.close()


def test_the_polls_read_no_message(tmp_path: Path) -> None:
    """What every request for work reads (a round's copies' outcomes; async: how many results wait) is kept in the
    tables after the messages, and SQLite reads a row's columns in order, through a message's overflow pages: 120
    copies of 585 KB cost 24 ms a read that way, on every poll of a thousand peers. Indexes answer those reads
    alone (a covering index: no row is read), in a file of today's relay and in one an older relay wrote."""
    SQLiteStore(tmp_path / "relay.sqlite3").close()
    old = tmp_path / "old.sqlite3"
    with sqlite3.connect(old) as db:
        db.executescript(SCHEMA.replace("CREATE INDEX", "-- CREATE INDEX"))
    SQLiteStore(old).close()
    for path in (tmp_path / "relay.sqlite3", old):
        with sqlite3.connect(path) as db:
            for poll in ("SELECT slot, peer_id, outcome FROM copies WHERE round = 0",
                         "SELECT COUNT(*) FROM arrivals WHERE merge IS NULL"):
                plan = " ".join(str(row[-1]) for row in db.execute(f"EXPLAIN QUERY PLAN {poll}"))
                assert "COVERING INDEX" in plan, (path.name, poll, plan)


def statements(store: SQLiteStore) -> list[str]:
    """The statements ``store`` runs from now on (SQLite's own trace of its connection)."""
    seen: list[str] = []
    store.connection.db.set_trace_callback(seen.append)
    return seen


def test_a_peers_token_and_address_the_bans_and_the_undos_are_read_once_not_on_every_request(tmp_path: Path) -> None:
    """Every request authenticates its peer, every accepted result reads its peer's address and asks whether an undo
    waits, and a copy's hand-out asks whether each candidate is banned: a read under the store's one lock each (7 %
    and 5 % of the event loop's time at a thousand peers, most of it waiting for that lock while the merge held it;
    on PostgreSQL, 6 of the 22 transactions an accepted result cost). A token's hash and an address are read once per
    peer (they never change), ``last_seen`` is written at most once per ``LAST_SEEN_RESOLUTION``, and the bans and
    undos are read again only after this store changed them."""
    clock = Clock()
    store = SQLiteStore(tmp_path / "relay.sqlite3", clock=clock)
    try:
        (peer, token), (other, _) = store.add_peer("a", "10.0.0.1"), store.add_peer("b", "10.0.0.2")
        assert store.authenticate(peer, token) and store.ban_reason(other) is None and store.undos() == []
        seen = statements(store)
        for _ in range(20):
            assert store.authenticate(peer, token) and not store.authenticate(peer, "wrong")
            assert store.ban_reason(peer) is None and store.ban_reason(other) is None and store.undos() == []
            assert store.peer_address(peer) == "10.0.0.1" and store.peer_address(other) == "10.0.0.2"
        assert seen == []
        store.request_undo(other)
        assert store.undos() == [(other, "pending", {})]
        store.undos()[0][2]["first"] = 3  # (what a caller does with its copy is not kept)
        store.set_undo(other, "running", {"first": 1})
        assert store.undos() == [(other, "running", {"first": 1})]
        seen.clear()
        assert store.undos() == [(other, "running", {"first": 1})] and seen == []
        store.set_undo(other, "done", {"first": 1})
        assert store.undos() == []
        seen.clear()
        clock.advance(LAST_SEEN_RESOLUTION)
        assert store.authenticate(peer, token) and store.authenticate(peer, token)
        assert [s.split()[0] for s in seen] == ["UPDATE"] and store.active_peers(0.5) == [peer]
        store.depart(peer)
        assert store.active_peers(0.5) == [] and store.authenticate(peer, token)  # (seen again at once)
        assert store.active_peers(0.5) == [peer]
        store.ban(other, "lied")
        assert store.ban_reason(other) == "lied" and store.ban_reason(peer) is None
        seen.clear()
        assert store.ban_reason(other) == "lied" and seen == []
        assert store.unban(other) and store.ban_reason(other) is None
        assert not store.authenticate("p-nobody", token)
    finally:
        store.close()


READ_LEASES = "SELECT round, slot, unit_index, peer_id, issued, deadline, copy, version FROM leases"  # (the view's)


def test_a_ban_or_a_peer_leaving_keeps_the_other_leases_as_read(tmp_path: Path) -> None:
    """A ban releases its peer's live leases and its leases in the stream, a peer leaving its live ones: the leases
    kept lose those rows and are not read again (a crowd's next request for work read a thousand rows after each;
    SQLite's own trace shows no read of the table), and what is kept is what the table holds (read afresh over a
    connection of the test's own: the oracle), the expired lease of a banned peer included."""
    clock, path = Clock(), tmp_path / "relay.sqlite3"
    store = SQLiteStore(path, clock=clock)
    try:
        a, b, c, d = (store.add_peer(name, f"10.0.0.{i}")[0] for i, name in enumerate("abcd"))
        assert store.grant(0, 9, 9, a, 1.0) is not None  # (a's lease that runs out)
        clock.advance(2.0)
        for slot, peer in enumerate((a, b, c, d)):
            assert store.grant(0, slot, slot, peer, 60.0) is not None
            assert store.grant(-1, slot, slot, peer, 60.0, version=1) is not None
            assert store.grant(-1, slot, slot, (b, c, d, a)[slot], 60.0, copy=1, version=1) is not None
        keys = [(0, 0), (-1, 0), (-1, 1)]
        assert all(store.leases(*key) for key in keys)
        seen = statements(store)
        store.release_leases_of(a)  # (a ban: its live leases go, then its leases in the stream)
        store.remove_arrivals_of(a)
        store.release_leases_on_leaving(b)
        store.remove_arrivals_of(c)  # (only its leases in the stream go)
        kept = {key: store.leases(*key) for key in keys}
        assert not [statement for statement in seen if statement.startswith(READ_LEASES)], seen
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT round, copy, slot, peer_id, deadline FROM leases").fetchall()
        table = {key: {(slot, peer, deadline) for r, copy, slot, peer, deadline in rows if (r, copy) == key}
                 for key in keys}
        assert {key: {(slot, lease.peer_id, lease.deadline) for slot, lease in view.items()}
                for key, view in kept.items()} == table
        assert (9, a, 1001.0) in table[0, 0] and {peer for _, peer, _ in table[0, 0]} == {a, c, d}
        assert {peer for _, peer, _ in table[-1, 0]} == {d} and {peer for _, peer, _ in table[-1, 1]} == {d}
    finally:
        store.close()
