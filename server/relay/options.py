"""The relay's options: what ``peertrain serve`` (and every other way of starting a relay) sets, typed, in one leaf
module that every part of the relay reads: ``RelayOptions`` (the session's relay) and ``ServerLimits`` (what
slow or silent clients may hold, which ``server.relay.limits`` enforces)."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.browser_assets.engines import ENGINE_CHOICES
from server.relay.coverage import DEFAULT_VERIFY_EVERY
from server.relay.direction import DEFAULT_VERIFY_DIRECTION, PREVIOUS_STEP_SLACK
from server.relay.verify import DEFAULT_VERIFY_ATOL, DEFAULT_VERIFY_FRACTION, DEFAULT_VERIFY_RTOL, REPLAY_WAITS
from server.session.settings import check_fields, setting

# Defaults of an open session (docs/sessions/defences.md).
DEFAULT_OUTLIER_FACTOR = 3.0
DEFAULT_JOIN_RATE = 2.0
DEFAULT_JOIN_BURST = 20
DEFAULT_MAX_PEERS_PER_ADDRESS = 128  # a school's or an office's NAT: one address, a class of volunteers
DEFAULT_BACKUP_AFTER = 1.0  # a unit out for longer than the session's median unit time gets a backup
# Merged rounds whose result messages stay in SQLite (the open round's always do: its merge, a restart and a
# dispute read them). Older ones keep only their audit rows (sha256, peer, unit, examples, verification).
DEFAULT_KEEP_RESULTS = 1
# Rounds a ban may merge again without the banned peer's results (server.relay.undo): their result messages and
# checkpoints stay on disk that long. 16 rounds of arith or bytetext are a few megabytes; a patient attacker caught
# by the default 10 % replay share has about 10 results merged before its ban, one or two a round.
DEFAULT_UNDO_ROUNDS = 16
# Connection limits (server.relay.limits).
DEFAULT_TIMEOUT_KEEP_ALIVE = 5  # uvicorn's default: an idle keep-alive connection is closed after this
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 60.0  # half the default lease: a result later than its lease is refused anyway
DEFAULT_LIMIT_CONCURRENCY = 1000  # 200 peers and 200 page watchers are ~400 connections
DEFAULT_BACKLOG = 2048  # uvicorn's default; a burst of joins beyond the listen queue waits for SYN retries
DEFAULT_MAX_HEAD_BYTES = 16 * 1024  # h11's default


SECONDS = "a number of seconds"
SHARE = "a share"


@dataclass(kw_only=True)
class RelayOptions:
    """Each field declares its setting (``server.session.settings``): ``serve``'s flags (and those of ``simulate
    --peer-speeds``, whose relay runs on a virtual clock) and the check of a value come from here."""

    admin_token: str = field(metadata=setting(
        help="admin token", metavar="TOKEN", env="PEERTRAIN_ADMIN_TOKEN", default_text="a new one, printed once",
        commands=("serve",)))
    join_code: str | None = field(default=None, metadata=setting(
        help="require this code to join", metavar="CODE", env="PEERTRAIN_JOIN_CODE", default_text="open",
        commands=("serve",)))
    lease_seconds: float = field(default=120.0, metadata=setting(  # a unit not returned by then is handed on
        help="time a peer has for one unit before it is handed to another (simulate: virtual seconds)", above=0,
        what=SECONDS, metavar="S", group="rounds"))
    peer_timeout: float = field(default=30.0, metadata=setting(
        help="silence after which a peer no longer counts as connected", above=0, what=SECONDS, metavar="S",
        commands=("serve",)))
    min_peers: int = field(default=1, metadata=setting(
        help="peers connected before the session's first round starts: a gate the host sets, never applied to a "
        "later round (1: none; a lone peer trains every unit of a round in turn)", minimum=1, metavar="N",
        commands=("serve",)))
    max_update_norm: float = field(default=1e4, metadata=setting(
        help="refuse a result whose update (result - global) has a larger L2 norm", above=0, metavar="NORM",
        commands=("serve",)))
    outlier_factor: float = field(default=DEFAULT_OUTLIER_FACTOR, metadata=setting(
        help="refuse an update more than this many times the median norm of the round's accepted updates (0: off)",
        minimum=0, metavar="F", group="guards", commands=("serve",)))
    outlier_min_results: int = field(default=2, metadata=setting(
        help="accepted results of the round before the relative check (--outlier-factor) applies", minimum=0,
        metavar="N", group="guards", commands=("serve",)))
    retry_seconds: float = field(default=1.0, metadata=setting(
        help="how long a waiting peer is told to wait before asking again (one that did not hold its request)",
        above=0, what=SECONDS, metavar="S", commands=("serve",)))
    join_rate: float = field(default=DEFAULT_JOIN_RATE, metadata=setting(
        help="joins per second per client address after a burst (0: no limit); over it a join gets 429 with "
        "Retry-After and a ticket that keeps its place: one address's joiners get in first come, first served",
        minimum=0, metavar="R", group="guards", commands=("serve",)))
    join_burst: int = field(default=DEFAULT_JOIN_BURST, metadata=setting(
        help="joins one address may make at once", minimum=0, metavar="N", group="guards", commands=("serve",)))
    max_peers_per_address: int = field(default=DEFAULT_MAX_PEERS_PER_ADDRESS, metadata=setting(
        help="live peers one client address may hold (0: any)", minimum=0, metavar="N", group="guards",
        commands=("serve",)))
    forwarded_allow_ips: str | None = field(default=None, metadata=setting(
        help="behind a reverse proxy: the proxies' addresses (comma list of IPs or networks) whose X-Forwarded-For "
        "the relay believes; the client is the right-most address no trusted proxy added (uvicorn's proxy-headers "
        "rule), so a header a client forged is ignored. Without it, the connection's own address", metavar="IPS",
        group="guards", commands=("serve",)))
    verify: bool = field(default=True, metadata=setting(  # off where the task cannot replay (server.relay.verify)
        help="no host replays (and so no bans for a failed one)", group="guards", commands=("serve",)))
    verify_fraction: float = field(default=DEFAULT_VERIFY_FRACTION, metadata=setting(
        help="share of results the host re-trains and compares, besides every peer's first result and the "
        "outliers (1: all)", minimum=0, maximum=1, what=SHARE, metavar="F", group="guards", commands=("serve",)))
    verify_every: int = field(default=DEFAULT_VERIFY_EVERY, metadata=setting(  # (server.relay.coverage)
        help="no peer goes more than N accepted results without a replay: after each check of a peer, one of its "
        "next N results, drawn in secret, is replayed (besides --verify-fraction; 0: no bound)", minimum=0,
        metavar="N", group="guards", commands=("serve",)))
    verify_trust: int = field(default=0, metadata=setting(  # (server.relay.coverage)
        help="adaptive replication: each replay a peer passes in a row doubles its --verify-every window, up to W "
        "results, and halves its --verify-fraction share; a peer is still replayed at least once in any W results "
        "and a lifted ban starts its record afresh (0: off, the window stays N); with --redundancy, each copy a "
        "peer passes does the same to its windows of copies and its --redundancy share", minimum=0, metavar="W",
        group="guards", commands=("serve",)))
    verify_direction: float | None = field(default=DEFAULT_VERIFY_DIRECTION, metadata=setting(
        help="replay every update whose cosine with the mean of its round's other updates is below COS (or with "
        f"the previous round's step below COS - {PREVIOUS_STEP_SLACK:g}), and every zero update "
        "(server.relay.direction; honest updates measured at +0.08 and above)", minimum=-1, maximum=1,
        metavar="COS", none_flag="--no-verify-direction", none_word="off", group="guards", commands=("serve",),
        none_help="no replays for an update's direction (a file: verify_direction = \"off\")"))
    verify_rtol: float = field(default=DEFAULT_VERIFY_RTOL, metadata=setting(
        help="replay tolerance: |result - replay| <= rtol * |replay - global| + atol", minimum=0, metavar="RTOL",
        default_text=f"the task's, else {DEFAULT_VERIFY_RTOL:g}", group="guards", commands=("serve",)))
    verify_atol: float = field(default=DEFAULT_VERIFY_ATOL, metadata=setting(
        help="the replay tolerance's absolute term (atol above)", minimum=0, metavar="ATOL", group="guards",
        commands=("serve",)))
    replay_engine: str = field(default="auto", metadata=setting(
        help="where the host replays units: pyodide (Pyodide under Node, the browser's own engine: a result trained "
        "on a browser's CPU must match bit for bit, and every built-in task is replayed), native (numpy here: "
        "within --verify-rtol, and tasks whose units part ways across engines are not replayed), or auto (pyodide "
        "where Node and the Pyodide assets are set up and the task reaches browsers, else native: a task module from "
        "this machine's Python path, not a file, is replayed natively)", choices=ENGINE_CHOICES, group="guards",
        commands=("serve",)))
    replay_wait: str = field(default="suspects", metadata=setting(
        help="which replays a round's merge waits for: suspects (outliers and updates suspect by direction; a routine "
        "replay (a peer's first result, the coverage bound, the sampled share) is judged after its round's merge, "
        "before the next one, and one that fails bans its peer and undoes its merged results, see --undo-rounds) "
        "or all (every replay of the round, as where bans cannot be undone: differential privacy, async mode, "
        "--undo-rounds 0)", choices=REPLAY_WAITS,
        group="guards", commands=("serve",)))
    replay_workers: int | None = field(default=None, metadata=setting(
        help="replays run at once (each a Pyodide worker process of about 150 MB)", minimum=1, metavar="N",
        default_text="half the machine's cores, 2 to 8", group="guards", commands=("serve",)))
    remote_replays: bool = field(default=False, metadata=setting(
        help="replays run on verification workers, not in this process: each is queued in the store and any "
        "`peertrain verify-worker --store URL` (on any machine that reaches the store, as many as you start) claims "
        "it for a while, replays it on --replay-engine's engine and sends it back; a worker that dies leaves its "
        "claim to run out and another takes it (no worker running: the replays wait, and so do merges that wait "
        "for them)", group="guards", commands=("serve",)))
    ban_addresses: bool = field(default=False, metadata=setting(
        help="a ban also refuses the banned peer's client address (default: the peer's token only, so one attacker "
        "behind a NAT does not lock out the volunteers who share its address); with it, a second copy of a unit "
        "also goes to another address", group="guards", commands=("serve",)))
    undo_rounds: int = field(default=DEFAULT_UNDO_ROUNDS, metadata=setting(  # (server.relay.undo)
        help="a ban merges again, without the banned peer's results, the rounds since its last result that passed a "
        "host replay, within the last R rounds (older ones stay as merged; the history's undo event lists them); the "
        "result messages of the last R rounds and R + 1 checkpoints stay on disk for it (0: a ban drops only the "
        "open round's results)", minimum=0, metavar="R", group="guards", commands=("serve",)))
    redundancy: float = field(default=0.0, metadata=setting(  # (server.relay.copies)
        help="share of units also trained by a second, different peer and compared with the first result, and "
        "every result of a peer no copy has confirmed yet (identical from one engine; a disagreement is decided by "
        "a host replay, or by more peers' results until two agree); never both merged",
        default_text="0: off", minimum=0, maximum=1, what=SHARE, metavar="F",
        group="guards", commands=("serve",)))
    backup_after: float | None = field(default=DEFAULT_BACKUP_AFTER, metadata=setting(
        help="once every unit of a round is out, an idle peer races the unit in flight longest when it has been "
        "out F times the session's median unit time (0: at once); the first result is merged, the other compared",
        minimum=0, metavar="F", none_flag="--no-backups", none_word="off", group="rounds",
        none_help="never hand out backups of slow units (a file: backup_after = \"off\")"))
    public_model: bool = field(default=False, metadata=setting(
        help="anyone may download the model (GET /api/model, the page's Download link); default: only with the "
        "admin token", commands=("serve",)))
    round_deadline: float | None = field(default=None, metadata=setting(
        help="a round merges S seconds after its first unit is handed out with what it has (at least "
        "--min-results); the units not back open the next round", above=0, what=SECONDS, metavar="S",
        default_text="no deadline", group="rounds"))
    min_results: int | None = field(default=None, metadata=setting(
        help="results a round needs to merge at its deadline", minimum=1, metavar="M",
        default_text="half its units, rounded up", group="rounds"))
    keep_results: int | None = field(default=DEFAULT_KEEP_RESULTS, metadata=setting(
        help="merged rounds whose result messages stay in SQLite, for audits and replays of recent rounds ('all' "
        "keeps every one); older rounds keep one audit row per result (peer, unit, examples, metrics, sha256, "
        "verification), so the disk stays flat. The open round's messages are always kept (its merge, a "
        "restart, a dispute need them)", minimum=0, metavar="N", none_word="all", commands=("serve",)))


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    """What ``peertrain serve`` bounds for slow or silent clients (``server.relay.limits`` enforces it): each field
    declares its setting, so ``serve``'s flags, a ``--config`` file's keys and the check of a value come from here,
    as for ``RelayOptions``. They hold without a session too (``serve --no-session``)."""

    timeout_keep_alive: int = field(default=DEFAULT_TIMEOUT_KEEP_ALIVE, metadata=setting(
        help="close an idle keep-alive connection after S seconds", minimum=1, metavar="S",
        commands=("serve",)))
    header_timeout: float = field(default=DEFAULT_HEADER_TIMEOUT, metadata=setting(
        help="a connection must send a complete request head within S seconds of opening or of its previous "
        "response, else it is closed (408 header_timeout)", above=0, what=SECONDS, metavar="S", commands=("serve",)))
    body_timeout: float = field(default=DEFAULT_BODY_TIMEOUT, metadata=setting(
        help="a request body must arrive in full within S seconds of its head (a result upload: of its turn, the "
        "relay reading 32 at once), else 408 body_timeout and the connection is closed (a 2.3 MB result needs "
        "40 KB/s at the default; raise it for big models on slow links)",
        above=0, what=SECONDS, metavar="S", commands=("serve",)))
    max_body_bytes: int | None = field(default=None, metadata=setting(
        help="refuse a body over N bytes with 413 too_large before reading it", minimum=1, metavar="N",
        default_text="the largest body an endpoint accepts, a result of this task's model", commands=("serve",)))
    limit_concurrency: int = field(default=DEFAULT_LIMIT_CONCURRENCY, metadata=setting(
        help="beyond N open connections or requests in flight, uvicorn answers 503 (each page holds about 2: its "
        "event stream and its worker's)", minimum=1, metavar="N", commands=("serve",)))
    backlog: int = field(default=DEFAULT_BACKLOG, metadata=setting(
        help="connections waiting to be accepted", minimum=1, metavar="N", commands=("serve",)))
    max_head_bytes: int = field(default=DEFAULT_MAX_HEAD_BYTES, metadata=setting(
        help="a request head over N bytes gets 400", minimum=1, metavar="N", commands=("serve",)))

    def __post_init__(self) -> None:
        check_fields(self)  # (a programmatic ServerLimits gets the bounds the flags get)
