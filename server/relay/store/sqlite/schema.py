"""The SQLite file's tables, and bringing a file written by an older relay up to date when it is opened."""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS peers (
    id TEXT PRIMARY KEY, token_hash TEXT NOT NULL, joined REAL NOT NULL, last_seen REAL NOT NULL,
    agent TEXT NOT NULL DEFAULT '', units_done INTEGER NOT NULL DEFAULT 0, address TEXT NOT NULL DEFAULT '',
    volunteer TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS volunteers (
    id TEXT PRIMARY KEY, public_key TEXT NOT NULL, name TEXT NOT NULL DEFAULT '', team TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, last_joined REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    round INTEGER NOT NULL, slot INTEGER NOT NULL, unit_index INTEGER NOT NULL, peer_id TEXT NOT NULL,
    issued REAL NOT NULL, deadline REAL NOT NULL, copy INTEGER NOT NULL DEFAULT 0, version INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (round, slot, copy)
);
CREATE TABLE IF NOT EXISTS results (
    round INTEGER NOT NULL, slot INTEGER NOT NULL, unit_index INTEGER NOT NULL, peer_id TEXT NOT NULL,
    num_examples INTEGER NOT NULL, metrics TEXT NOT NULL, message BLOB NOT NULL, received REAL NOT NULL,
    sha256 TEXT NOT NULL DEFAULT '', size INTEGER NOT NULL DEFAULT 0, verification TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (round, slot)
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS copies (
    round INTEGER NOT NULL, slot INTEGER NOT NULL, peer_id TEXT NOT NULL, message BLOB NOT NULL,
    received REAL NOT NULL, outcome TEXT NOT NULL, sha256 TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (round, slot, peer_id)
);
CREATE TABLE IF NOT EXISTS arrivals (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, entry INTEGER NOT NULL UNIQUE, unit_index INTEGER NOT NULL,
    peer_id TEXT NOT NULL, version INTEGER NOT NULL, num_examples INTEGER NOT NULL, metrics TEXT NOT NULL,
    message BLOB NOT NULL, update_vector BLOB NOT NULL, received REAL NOT NULL, merge INTEGER,
    sha256 TEXT NOT NULL DEFAULT '', size INTEGER NOT NULL DEFAULT 0
);
-- An arrival's message and update, beside its row: marking a hundred arrivals merged rewrote each row with its
-- message (167 ms a merge, under the lock every request waits on), and emptying one is a delete here. The arrivals'
-- own message and update_vector columns are empty (an older file's are moved here on open).
CREATE TABLE IF NOT EXISTS arrival_messages (
    seq INTEGER PRIMARY KEY, message BLOB NOT NULL, update_vector BLOB NOT NULL
);
-- How each arrival was checked and what a held one waits for, beside the arrivals (an update of an arrival's row
-- would write its message again).
CREATE TABLE IF NOT EXISTS arrival_checks (
    entry INTEGER NOT NULL, peer_id TEXT NOT NULL, outcome TEXT NOT NULL DEFAULT '', waiting TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (entry, peer_id)
);
-- Columns a poll reads that the table keeps after a result's message: SQLite reads a row's columns in order, through
-- a message's overflow pages (hundreds of kilobytes each), so these indexes answer those polls without the rows.
CREATE INDEX IF NOT EXISTS copies_outcomes ON copies (round, slot, peer_id, outcome);
CREATE INDEX IF NOT EXISTS arrivals_waiting ON arrivals (merge, seq);
CREATE TABLE IF NOT EXISTS bans (
    peer_id TEXT PRIMARY KEY, address TEXT NOT NULL, reason TEXT NOT NULL, time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS undos (
    peer_id TEXT PRIMARY KEY, state TEXT NOT NULL, plan TEXT NOT NULL, time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS replay_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, task TEXT NOT NULL, weights TEXT NOT NULL,
    unit BLOB NOT NULL, engine TEXT NOT NULL, queued REAL NOT NULL, worker TEXT, claimed_until REAL,
    attempts INTEGER NOT NULL DEFAULT 0, finished REAL, message BLOB, error TEXT, seconds REAL, ran_on TEXT
);
CREATE INDEX IF NOT EXISTS replay_jobs_open ON replay_jobs (finished, id);
CREATE TABLE IF NOT EXISTS pause (id INTEGER PRIMARY KEY, paused INTEGER NOT NULL, pause_from INTEGER);
CREATE TABLE IF NOT EXISTS refusals (
    round INTEGER NOT NULL, slot INTEGER NOT NULL, peer_id TEXT NOT NULL, PRIMARY KEY (round, slot, peer_id)
);
CREATE TABLE IF NOT EXISTS wanted_copies (round INTEGER NOT NULL, slot INTEGER NOT NULL, PRIMARY KEY (round, slot));
CREATE TABLE IF NOT EXISTS forwarded (
    id INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER NOT NULL, slot INTEGER NOT NULL, peer_id TEXT NOT NULL,
    message BLOB NOT NULL, received REAL NOT NULL, verdict TEXT
);
"""

# Columns added since the first files (table -> column -> definition): added to an older file on open.
ADDED_COLUMNS = {
    "peers": {"address": "TEXT NOT NULL DEFAULT ''", "volunteer": "TEXT NOT NULL DEFAULT ''"},
    "results": {"sha256": "TEXT NOT NULL DEFAULT ''", "size": "INTEGER NOT NULL DEFAULT 0",
                "verification": "TEXT NOT NULL DEFAULT ''"},
    "copies": {"sha256": "TEXT NOT NULL DEFAULT ''"},
    "arrivals": {"sha256": "TEXT NOT NULL DEFAULT ''", "size": "INTEGER NOT NULL DEFAULT 0"},
    "leases": {"version": "INTEGER NOT NULL DEFAULT 0"},
}


def columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def create_or_upgrade(db: sqlite3.Connection) -> None:
    """Create the tables a new file lacks; give an older file the columns added since it was written."""
    db.executescript(SCHEMA)
    for table, added in ADDED_COLUMNS.items():
        present = columns(db, table)
        for name, definition in added.items():
            if name not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
    move_arrival_messages(db)
    if "copy" not in columns(db, "leases"):
        # a file from before second copies: leases are handed out again after a restart anyway
        db.executescript("DROP TABLE leases;" + SCHEMA)


def move_arrival_messages(db: sqlite3.Connection) -> None:
    """Move the messages an older relay kept in its arrivals' rows to ``arrival_messages`` (nothing where none)."""
    if db.execute("SELECT 1 FROM arrivals WHERE length(message) > 0 OR length(update_vector) > 0 LIMIT 1").fetchone():
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("INSERT INTO arrival_messages (seq, message, update_vector) SELECT seq, message, update_vector "
                       "FROM arrivals WHERE length(message) > 0 ON CONFLICT (seq) DO NOTHING")
            db.execute("UPDATE arrivals SET message = ?, update_vector = ? WHERE length(message) > 0 OR "
                       "length(update_vector) > 0", (b"", b""))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
