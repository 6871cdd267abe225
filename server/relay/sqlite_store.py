"""The relay's session state in SQLite (one file beside the checkpoints).

Peers (id, hashed token, last seen), leases (who trains which slot of which round, until when), every
accepted result (weights included, so a restart loses nothing and a session can be replayed through the
simulator's merge), and counters of refusals by reason. Checkpoints (weights, merge state, history) live on
disk beside this file; see ``server.session.checkpoint_files``.

Bounded disk: a result's message is only needed until its round is merged and checkpointed (the merge, a
restart, a dispute between two copies all read the open round's messages). ``prune_before`` then empties the
messages of older rounds and keeps what an audit needs per result: peer, unit, slot, example count, metrics,
the message's sha256 and size, and how it was verified. Freed pages are reused, so the file stops growing;
the write-ahead log is truncated after each prune.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Columns added since the first files (table -> column -> definition): added to an older file on open.
ADDED_COLUMNS = {
    "peers": {"address": "TEXT NOT NULL DEFAULT ''"},
    "results": {"sha256": "TEXT NOT NULL DEFAULT ''", "size": "INTEGER NOT NULL DEFAULT 0",
                "verification": "TEXT NOT NULL DEFAULT ''"},
    "copies": {"sha256": "TEXT NOT NULL DEFAULT ''"},
    "arrivals": {"sha256": "TEXT NOT NULL DEFAULT ''"},
}
WAL_LIMIT_BYTES = 8 << 20  # the write-ahead log is cut back to this after a checkpoint of it
LAST_SEEN_RESOLUTION = 1.0  # seconds; "connected" is judged over the peer timeout (30 s by default)

SCHEMA = """
CREATE TABLE IF NOT EXISTS peers (
    id TEXT PRIMARY KEY, token_hash TEXT NOT NULL, joined REAL NOT NULL, last_seen REAL NOT NULL,
    agent TEXT NOT NULL DEFAULT '', units_done INTEGER NOT NULL DEFAULT 0, address TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS leases (
    round INTEGER NOT NULL, slot INTEGER NOT NULL, unit_index INTEGER NOT NULL, peer_id TEXT NOT NULL,
    issued REAL NOT NULL, deadline REAL NOT NULL, copy INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (round, slot, copy)
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
    sha256 TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS bans (
    peer_id TEXT PRIMARY KEY, address TEXT NOT NULL, reason TEXT NOT NULL, time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS undos (
    peer_id TEXT PRIMARY KEY, state TEXT NOT NULL, plan TEXT NOT NULL, time REAL NOT NULL
);
"""


def hash_token(token: str) -> str:
    return sha256_hex(token.encode())


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Lease:
    round: int
    slot: int
    unit_index: int
    peer_id: str
    issued: float
    deadline: float
    copy: int = 0  # 0: the unit's own lease; 1: a second copy (redundancy, a backup)


@dataclass(frozen=True)
class StoredResult:
    round: int
    slot: int
    unit_index: int
    peer_id: str
    num_examples: int
    metrics: dict[str, Any]
    message: bytes
    engine: str = ""  # what the result says it trained on (header meta; not stored apart from the message)


class Store:
    """Thread-safe access to the relay's SQLite file (the merge runs in a worker thread)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock  # what "now" is for leases, results and peers (a simulator runs a virtual one)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self.open()

    def open(self) -> None:
        """Connect (again, after ``close``); creates the tables of a new file."""
        with self._lock:
            if self._db is not None:
                return
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL under WAL: a commit survives the process being killed (what the crash tests do); only a
            # power cut may lose the last commits, whose units are then handed out again. FULL synced every
            # commit on the event loop: 20 ms a counter under load (``peertrain bench load``).
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            self._db.executescript(SCHEMA)
            for table, added in ADDED_COLUMNS.items():  # a file from before these columns
                columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                for name, definition in added.items():
                    if name not in columns:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
            if "copy" not in {row[1] for row in self._db.execute("PRAGMA table_info(leases)")}:
                # a file from before second copies: leases are handed out again after a restart anyway
                self._db.executescript("DROP TABLE leases;" + SCHEMA)

    @property
    def closed(self) -> bool:
        return self._db is None

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.ProgrammingError(f"the store {self.path} is closed")
        return self._db

    def _run(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self.db.execute(sql, args).fetchall()

    # -- peers ----------------------------------------------------------------------------------
    def add_peer(self, agent: str = "", address: str = "") -> tuple[str, str]:
        peer_id, token = "p-" + secrets.token_hex(4), secrets.token_urlsafe(24)
        now = self.clock()
        self._run("INSERT INTO peers (id, token_hash, joined, last_seen, agent, address) VALUES (?, ?, ?, ?, ?, ?)",
                  (peer_id, hash_token(token), now, now, agent[:200], address[:100]))
        return peer_id, token

    def live_peers_at(self, address: str, within_seconds: float) -> int:
        """Peers from ``address`` seen within ``within_seconds`` (the cap on live peers per address)."""
        since = self.clock() - within_seconds
        return int(self._run("SELECT COUNT(*) FROM peers WHERE address = ? AND last_seen >= ?", (address, since))[0][0])

    def addresses(self, within_seconds: float) -> int:
        """How many distinct client addresses have a peer seen within ``within_seconds``."""
        since = self.clock() - within_seconds
        return int(self._run("SELECT COUNT(DISTINCT address) FROM peers WHERE last_seen >= ?", (since,))[0][0])

    def authenticate(self, peer_id: str, token: str, *, touch: bool = True) -> bool:
        """Constant-time comparison of the token's hash with the stored one; refreshes last_seen (unless ``touch`` is
        False: a request of a peer that left, still in flight, does not make it connected again).

        last_seen is written at most once per LAST_SEEN_RESOLUTION seconds per peer: each write is a
        synced commit, and a peer makes several requests per unit."""
        rows = self._run("SELECT token_hash, last_seen FROM peers WHERE id = ?", (peer_id,))
        expected = rows[0][0] if rows else hash_token(secrets.token_hex(8))
        ok = hmac.compare_digest(expected, hash_token(token)) and bool(rows)
        now = self.clock()
        if ok and touch and not now - float(rows[0][1]) < LAST_SEEN_RESOLUTION:
            self._run("UPDATE peers SET last_seen = ? WHERE id = ?", (now, peer_id))
        return ok

    def depart(self, peer_id: str) -> None:
        """``peer_id`` said it is leaving (its page closed): it stops counting as connected and against its
        address's cap at once. Its token stays valid: asking for work again brings it back."""
        self._run("UPDATE peers SET last_seen = 0 WHERE id = ?", (peer_id,))

    def active_peers(self, within_seconds: float) -> list[str]:
        """Peers in good standing seen recently or holding a live lease (a peer deep in a unit does not poll). A
        banned peer never counts: nothing waits for it."""
        now = self.clock()
        rows = self._run("SELECT id FROM peers WHERE last_seen >= ? UNION "
                         "SELECT peer_id FROM leases WHERE deadline >= ? EXCEPT SELECT peer_id FROM bans",
                         (now - within_seconds, now))
        return sorted(r[0] for r in rows)

    def peer_count(self) -> int:
        return int(self._run("SELECT COUNT(*) FROM peers")[0][0])

    # -- leases ---------------------------------------------------------------------------------
    def leases(self, round_index: int, copy: int = 0) -> dict[int, Lease]:
        """The leases of ``round_index`` by slot: the units' own (``copy`` 0) or their second copies (1)."""
        rows = self._run("SELECT round, slot, unit_index, peer_id, issued, deadline, copy FROM leases "
                         "WHERE round = ? AND copy = ?", (round_index, copy))
        return {row[1]: Lease(*row) for row in rows}

    def grant(self, round_index: int, slot: int, unit_index: int, peer_id: str, seconds: float,
              copy: int = 0) -> Lease:
        now = self.clock()
        self._run("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (round_index, slot, unit_index, peer_id, now, now + seconds, copy))
        return Lease(round_index, slot, unit_index, peer_id, now, now + seconds, copy)

    def release(self, round_index: int, slot: int, peer_id: str | None = None) -> None:
        """Drop the leases on a slot (its result was refused), or only ``peer_id``'s: the next peer to ask may
        take it."""
        if peer_id is None:
            self._run("DELETE FROM leases WHERE round = ? AND slot = ?", (round_index, slot))
        else:
            self._run("DELETE FROM leases WHERE round = ? AND slot = ? AND peer_id = ?", (round_index, slot, peer_id))

    def swap_copies(self, round_index: int, slot: int) -> None:
        """The second copy's lease becomes the unit's own and the other way round (its result came first)."""
        with self._lock:
            for source, target in ((0, 2), (1, 0), (2, 1)):
                self.db.execute("UPDATE leases SET copy = ? WHERE round = ? AND slot = ? AND copy = ?",
                                (target, round_index, slot, source))

    def release_leases_of(self, peer_id: str) -> int:
        """Drop the live leases ``peer_id`` holds (it was banned): its units go to the next peer that asks."""
        with self._lock:
            return self.db.execute("DELETE FROM leases WHERE peer_id = ? AND deadline >= ?",
                                   (peer_id, self.clock())).rowcount

    def release_leases_on_leaving(self, peer_id: str) -> int:
        """Drop every live lease ``peer_id`` holds (it left, so it counts as connected no longer); returns how many
        were on units it had not delivered: those go to the next peer that asks."""
        live = "peer_id = ? AND deadline >= ?"
        with self._lock:
            unfinished = self.db.execute(f"SELECT COUNT(*) FROM leases WHERE {live} AND (copy > 0 OR NOT EXISTS "
                                         "(SELECT 1 FROM results r WHERE r.round = leases.round AND "
                                         "r.slot = leases.slot))", (peer_id, self.clock())).fetchone()[0]
            self.db.execute(f"DELETE FROM leases WHERE {live}", (peer_id, self.clock()))
            return int(unfinished)

    def release_live_leases(self) -> int:
        """After a restart nobody holds anything: every unfinished unit is handed out again."""
        with self._lock:
            cursor = self.db.execute("DELETE FROM leases WHERE copy > 0 OR NOT EXISTS (SELECT 1 FROM results r "
                                      "WHERE r.round = leases.round AND r.slot = leases.slot)")
            return cursor.rowcount

    # -- results --------------------------------------------------------------------------------
    def add_result(self, result: StoredResult, *, count_unit: bool = True) -> None:
        self._run("INSERT INTO results (round, slot, unit_index, peer_id, num_examples, metrics, message, received, "
                  "sha256, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (result.round, result.slot, result.unit_index, result.peer_id, result.num_examples,
                   json.dumps(result.metrics), result.message, self.clock(), sha256_hex(result.message),
                   len(result.message)))
        if count_unit:  # (a promoted copy was counted when it came in)
            self._run("UPDATE peers SET units_done = units_done + 1 WHERE id = ?", (result.peer_id,))

    def result_slots(self, round_index: int) -> set[int]:
        """The slots of ``round_index`` that have a result, without reading the messages."""
        return {row[0] for row in self._run("SELECT slot FROM results WHERE round = ?", (round_index,))}

    def result_peer(self, round_index: int, slot: int) -> str | None:
        rows = self._run("SELECT peer_id FROM results WHERE round = ? AND slot = ?", (round_index, slot))
        return str(rows[0][0]) if rows else None

    def results(self, round_index: int) -> dict[int, StoredResult]:
        rows = self._run("SELECT round, slot, unit_index, peer_id, num_examples, metrics, message FROM results "
                         "WHERE round = ? ORDER BY slot", (round_index,))
        return {row[1]: StoredResult(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), bytes(row[6]))
                for row in rows}

    def replace_message(self, round_index: int, slot: int, message: bytes) -> None:  # (audit: sha256, size stay)
        self._run("UPDATE results SET message = ? WHERE round = ? AND slot = ?", (message, round_index, slot))

    def all_results(self) -> list[StoredResult]:
        rows = self._run("SELECT round, slot, unit_index, peer_id, num_examples, metrics, message FROM results "
                         "ORDER BY round, slot")
        return [StoredResult(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), bytes(r[6])) for r in rows]

    def remove_result(self, round_index: int, slot: int) -> None:
        self._run("DELETE FROM results WHERE round = ? AND slot = ?", (round_index, slot))

    def set_verification(self, round_index: int, slot: int, peer_id: str, outcome: str) -> None:
        """How the merged result of a slot was checked (a replay, a compared copy), for the audit."""
        self._run("UPDATE results SET verification = CASE WHEN verification = '' THEN ? ELSE "
                  "substr(verification || '; ' || ?, 1, 500) END WHERE round = ? AND slot = ? AND peer_id = ?",
                  (outcome, outcome, round_index, slot, peer_id))

    def audit(self) -> list[dict[str, Any]]:
        """Every merged result without its message: who, which unit, what it claimed, its sha256 and size, how
        it was verified, and whether the message is still kept."""
        rows = self._run("SELECT round, slot, unit_index, peer_id, num_examples, metrics, sha256, size, verification, "
                         "length(message) > 0, received FROM results ORDER BY round, slot")
        return [{"round": r[0], "slot": r[1], "unit_index": r[2], "peer_id": r[3], "num_examples": r[4],
                 "metrics": json.loads(r[5]), "sha256": r[6], "size": r[7], "verification": r[8] or "not checked",
                 "message_kept": bool(r[9]), "received": r[10]} for r in rows]

    # -- bounded disk: messages of merged rounds are emptied, their audit rows stay ---------------------
    def prune_before(self, round_index: int) -> int:
        """Empty the result and copy messages of rounds before ``round_index`` (already merged and
        checkpointed); returns how many were emptied. The write-ahead log is truncated afterwards."""
        with self._lock:
            emptied = self.db.execute("UPDATE results SET message = X'' WHERE round < ? AND length(message) > 0",
                                      (round_index,)).rowcount
            emptied += self.db.execute("UPDATE copies SET message = X'' WHERE round < ? AND length(message) > 0",
                                       (round_index,)).rowcount
        if emptied:
            self.truncate_log()
        return emptied

    def prune_arrivals_before(self, merge: int) -> int:
        """Asynchronous mode: empty the messages of results merged before merge ``merge``."""
        with self._lock:
            emptied = self.db.execute("UPDATE arrivals SET message = X'', update_vector = X'' WHERE merge IS NOT NULL "
                                      "AND merge < ? AND length(message) > 0", (merge,)).rowcount
        if emptied:
            self.truncate_log()
        return emptied

    def truncate_log(self) -> None:
        with self._lock:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def disk_bytes(self) -> int:
        """The SQLite file with its write-ahead log and shared-memory index."""
        return sum(path.stat().st_size for path in (self.path, self.path.with_name(self.path.name + "-wal"),
                                                    self.path.with_name(self.path.name + "-shm")) if path.exists())

    # -- second copies of a unit (redundancy): compared with the merged result, never merged themselves --
    def add_copy(self, round_index: int, slot: int, peer_id: str, message: bytes, outcome: str) -> None:
        self._run("INSERT OR REPLACE INTO copies (round, slot, peer_id, message, received, outcome, sha256) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?)", (round_index, slot, peer_id, message, self.clock(), outcome,
                                                   sha256_hex(message)))
        self._run("UPDATE peers SET units_done = units_done + 1 WHERE id = ?", (peer_id,))

    def set_copy_outcome(self, round_index: int, slot: int, peer_id: str, outcome: str) -> None:
        self._run("UPDATE copies SET outcome = ? WHERE round = ? AND slot = ? AND peer_id = ?",
                  (outcome, round_index, slot, peer_id))

    def copies(self, round_index: int) -> dict[tuple[int, str], str]:
        """(slot, peer) -> outcome of the round's second copies, without their messages."""
        return {(r[0], r[1]): r[2] for r in self._run("SELECT slot, peer_id, outcome FROM copies WHERE round = ?",
                                                       (round_index,))}

    def copy_message(self, round_index: int, slot: int, peer_id: str) -> bytes | None:
        rows = self._run("SELECT message FROM copies WHERE round = ? AND slot = ? AND peer_id = ?",
                         (round_index, slot, peer_id))
        return bytes(rows[0][0]) if rows else None

    def peer_address(self, peer_id: str) -> str:
        rows = self._run("SELECT address FROM peers WHERE id = ?", (peer_id,))
        return str(rows[0][0]) if rows else ""

    # -- asynchronous mode (server.relay.buffered): results in arrival order, merged K at a time ------
    def add_arrival(self, *, entry: int, unit_index: int, peer_id: str, version: int, num_examples: int,
                    metrics: dict[str, Any], message: bytes, update: bytes) -> int:
        with self._lock:
            cursor = self.db.execute(
                "INSERT INTO arrivals (entry, unit_index, peer_id, version, num_examples, metrics, message, "
                "update_vector, received, merge, sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                (entry, unit_index, peer_id, version, num_examples, json.dumps(metrics), message, update,
                 self.clock(), sha256_hex(message)))
            self.db.execute("UPDATE peers SET units_done = units_done + 1 WHERE id = ?", (peer_id,))
            return int(cursor.lastrowid or 0)

    def arrived_entries(self) -> set[int]:
        return {int(r[0]) for r in self._run("SELECT entry FROM arrivals")}

    def buffered(self) -> list[tuple[int, int, int, int, int, dict[str, Any], bytes]]:
        """The results not merged yet, in arrival order: (seq, entry, unit, version, examples, metrics, update)."""
        rows = self._run("SELECT seq, entry, unit_index, version, num_examples, metrics, update_vector FROM arrivals "
                         "WHERE merge IS NULL ORDER BY seq")
        return [(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), bytes(r[6])) for r in rows]

    def buffered_count(self) -> int:
        return int(self._run("SELECT COUNT(*) FROM arrivals WHERE merge IS NULL")[0][0])

    def mark_merged(self, seqs: list[int], merge: int) -> None:
        with self._lock:
            self.db.executemany("UPDATE arrivals SET merge = ? WHERE seq = ?", [(merge, seq) for seq in seqs])

    def unmerge_from(self, merge: int) -> int:
        """After a restart: results marked for merges the checkpoint does not hold go back to the buffer."""
        with self._lock:
            return self.db.execute("UPDATE arrivals SET merge = NULL WHERE merge >= ?", (merge,)).rowcount

    def arrivals(self) -> list[tuple[int, int, int, int, int, int, dict[str, Any], bytes]]:
        """Every merged result: (seq, entry, unit, version, merge, examples, metrics, message), arrival order."""
        rows = self._run("SELECT seq, entry, unit_index, version, merge, num_examples, metrics, message FROM "
                         "arrivals WHERE merge IS NOT NULL ORDER BY seq")
        return [(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), bytes(r[7])) for r in rows]

    # -- bans -----------------------------------------------------------------------------------
    def ban(self, peer_id: str, reason: str) -> str:
        """Ban ``peer_id`` (and, through it, its address); returns the address."""
        rows = self._run("SELECT address FROM peers WHERE id = ?", (peer_id,))
        address = rows[0][0] if rows else ""
        self._run("INSERT OR REPLACE INTO bans VALUES (?, ?, ?, ?)", (peer_id, address, reason[:500], self.clock()))
        return str(address)

    def unban(self, peer_id: str) -> bool:
        with self._lock:
            return self.db.execute("DELETE FROM bans WHERE peer_id = ?", (peer_id,)).rowcount > 0

    def ban_reason(self, peer_id: str) -> str | None:
        rows = self._run("SELECT reason FROM bans WHERE peer_id = ?", (peer_id,))
        return str(rows[0][0]) if rows else None

    def address_banned(self, address: str) -> bool:
        return bool(address) and bool(self._run("SELECT 1 FROM bans WHERE address = ? LIMIT 1", (address,)))

    def peers_listing(self) -> list[dict[str, Any]]:
        """Every peer with its address, units, last seen, and ban (for ``GET /api/admin/peers``)."""
        rows = self._run("SELECT p.id, p.address, p.agent, p.joined, p.last_seen, p.units_done, b.reason, b.time "
                         "FROM peers p LEFT JOIN bans b ON b.peer_id = p.id ORDER BY p.joined")
        return [{"peer_id": r[0], "address": r[1], "agent": r[2], "joined": r[3], "last_seen": r[4],
                 "units_done": r[5], "banned": r[6] is not None, "ban_reason": r[6], "banned_at": r[7]}
                for r in rows]

    def remove_results_of(self, peer_id: str, round_index: int) -> list[int]:
        """Drop ``peer_id``'s results and leases of ``round_index`` (a banned peer); returns their slots."""
        slots = [r[0] for r in self._run("SELECT slot FROM results WHERE round = ? AND peer_id = ?",
                                         (round_index, peer_id))]
        self._run("DELETE FROM results WHERE round = ? AND peer_id = ?", (round_index, peer_id))
        self._run("DELETE FROM leases WHERE round = ? AND peer_id = ?", (round_index, peer_id))
        return slots

    # -- undoing what a banned peer's results moved (server.relay.undo) ------------------------------
    def request_undo(self, peer_id: str) -> None:
        """A ban asks for its peer's results to be undone (again after an unban and a second ban)."""
        self._run("INSERT INTO undos VALUES (?, 'pending', '{}', ?) ON CONFLICT(peer_id) DO UPDATE SET state = "
                  "'pending', plan = '{}', time = excluded.time WHERE state = 'done'", (peer_id, self.clock()))

    def undos(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The undos not done, oldest first: (peer, state, plan)."""
        rows = self._run("SELECT peer_id, state, plan FROM undos WHERE state != 'done' ORDER BY time, peer_id")
        return [(r[0], r[1], json.loads(r[2])) for r in rows]

    def set_undo(self, peer_id: str, state: str, plan: dict[str, Any]) -> None:
        self._run("UPDATE undos SET state = ?, plan = ? WHERE peer_id = ?", (state, json.dumps(plan), peer_id))

    def unverified_rounds(self, peer_id: str) -> tuple[int | None, list[int]]:
        """(the round of ``peer_id``'s last result that passed a host replay, or None; the rounds of its results from
        then on that did not, and are not undone yet)."""
        verified = self._run("SELECT MAX(round) FROM results WHERE peer_id = ? AND verification LIKE "
                             "'%replay passed%'", (peer_id,))[0][0]
        rows = self._run("SELECT DISTINCT round FROM results WHERE peer_id = ? AND round >= ? AND verification NOT "
                         "LIKE '%replay passed%' AND verification NOT LIKE 'undone%' ORDER BY round",
                         (peer_id, -1 if verified is None else verified))
        return verified, [int(r[0]) for r in rows]

    def mark_undone(self, peer_id: str, first: int, end: int) -> int:
        """Mark ``peer_id``'s unverified results of rounds ``first`` to ``end - 1`` undone (merged no more; their
        audit rows stay); returns how many."""
        with self._lock:
            return self.db.execute("UPDATE results SET verification = 'undone (peer banned)' || CASE WHEN verification "
                                   "= '' THEN '' ELSE '; ' || verification END WHERE peer_id = ? AND round >= ? AND "
                                   "round < ? AND verification NOT LIKE '%replay passed%' AND verification NOT LIKE "
                                   "'undone%'", (peer_id, first, end)).rowcount

    def undone_slots(self, round_index: int) -> set[int]:
        return {r[0] for r in self._run("SELECT slot FROM results WHERE round = ? AND verification LIKE 'undone%'",
                                        (round_index,))}

    def pruned_rounds(self, first: int, end: int) -> set[int]:
        """Rounds from ``first`` to ``end - 1`` with a result whose message was emptied (``prune_before``)."""
        return {r[0] for r in self._run("SELECT DISTINCT round FROM results WHERE round >= ? AND round < ? AND "
                                        "length(message) = 0", (first, end))}

    def reset_round(self, round_index: int) -> int:
        """Forget the open round's results, second copies and leases (its weights changed under it: a ban's undo);
        returns how many results went. Their units are handed out again."""
        with self._lock:
            dropped = self.db.execute("DELETE FROM results WHERE round = ?", (round_index,)).rowcount
            self.db.execute("DELETE FROM copies WHERE round = ?", (round_index,))
            self.db.execute("DELETE FROM leases WHERE round = ?", (round_index,))
            return int(dropped)

    # -- counters -------------------------------------------------------------------------------
    def count(self, name: str, by: int = 1) -> None:
        self._run("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
                  (name, by, by))

    def counters(self) -> dict[str, int]:
        return {name: int(value) for name, value in self._run("SELECT name, value FROM counters ORDER BY name")}
