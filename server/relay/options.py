"""The relay's options: what ``peertrain serve`` (and every other way of starting a relay) sets, typed, in one leaf
module that every part of the relay reads."""

from __future__ import annotations

from dataclasses import dataclass

from server.relay.verify import DEFAULT_VERIFY_ATOL, DEFAULT_VERIFY_FRACTION, DEFAULT_VERIFY_RTOL

# Defaults of an open session (README, "What an open session defends against").
DEFAULT_OUTLIER_FACTOR = 3.0
DEFAULT_JOIN_RATE = 2.0
DEFAULT_JOIN_BURST = 20
DEFAULT_MAX_PEERS_PER_ADDRESS = 32
DEFAULT_BACKUP_AFTER = 1.0  # a unit out for longer than the session's median unit time gets a backup
# Merged rounds whose result messages stay in SQLite (the open round's always do: its merge, a restart and a
# dispute read them). Older ones keep only their audit rows (sha256, peer, unit, examples, verification).
DEFAULT_KEEP_RESULTS = 1


@dataclass(kw_only=True)
class RelayOptions:
    admin_token: str
    join_code: str | None = None
    lease_seconds: float = 120.0  # a unit not returned by then is handed to someone else
    peer_timeout: float = 30.0  # a peer not heard from for this long no longer counts as connected
    min_peers: int | None = None  # peers needed before a round starts (default: k)
    max_update_norm: float = 1e4  # L2 norm of (result - global) above which a result is refused
    outlier_factor: float = DEFAULT_OUTLIER_FACTOR  # refuse updates this many times the round's median norm
    outlier_min_results: int = 2  # accepted results of the round before the relative check applies
    retry_seconds: float = 1.0  # what a waiting peer is told (one that did not hold its request)
    join_rate: float = DEFAULT_JOIN_RATE  # joins per second per client address, after a burst (0: no limit)
    join_burst: int = DEFAULT_JOIN_BURST
    max_peers_per_address: int = DEFAULT_MAX_PEERS_PER_ADDRESS  # live peers one address may hold (0: any)
    trusted_proxy_header: str | None = None  # e.g. X-Forwarded-For, only behind a proxy that sets it
    verify: bool = True  # replay results on the host (server.relay.verify); off where the task cannot replay
    verify_fraction: float = DEFAULT_VERIFY_FRACTION  # share of results replayed besides firsts and outliers
    verify_rtol: float = DEFAULT_VERIFY_RTOL
    verify_atol: float = DEFAULT_VERIFY_ATOL
    ban_addresses: bool = True  # a banned peer's client address may not join again
    redundancy: float = 0.0  # share of units trained by a second peer and compared (server.relay.copies)
    backup_after: float | None = DEFAULT_BACKUP_AFTER  # backups after F x the median unit time (None: off)
    public_model: bool = False  # GET /api/model (the page's Download link) without the admin token
    round_deadline: float | None = None  # seconds after its first hand-out a round merges what it has
    min_results: int | None = None  # results a round needs at its deadline (default: half its units)
    keep_results: int | None = DEFAULT_KEEP_RESULTS  # merged rounds whose messages are kept (None: all)
