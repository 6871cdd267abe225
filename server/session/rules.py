"""Which settings go together: the one function every way of starting a session calls (``serve``, ``simulate``,
the admin API's new session), so a rule is written once and holds on each.

``resolve(config, options, package)`` checks the session's settings against the relay's options and the task;
it raises a ``SessionError`` naming a conflict, and turns off what cannot apply (host replays for a local task, a
task whose engines part ways), saying so in its notes. It changes nothing it is given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from server.session.settings import SessionError, check_fields

if TYPE_CHECKING:
    from server.session.config import SessionConfig
    from server.session.package import Package


class RelaySide(Protocol):
    """What the rules read of the relay's options (``server.relay.options.RelayOptions``, a dataclass); the
    session package knows nothing of the relay, so it names only these."""

    verify: bool
    redundancy: float
    round_deadline: float | None
    replay_engine: str


@dataclass(frozen=True)
class Resolution[Options: RelaySide]:
    """The settings a session starts with, and what was turned off (one sentence each, for the log)."""

    config: SessionConfig
    options: Options
    notes: tuple[str, ...]


def resolve[Options: RelaySide](config: SessionConfig, options: Options, package: Package, *,
                                force_verify: bool = False) -> Resolution[Options]:
    """The session's settings made consistent, or a ``SessionError`` naming the conflict. ``force_verify``:
    replay even a task whose browser and native units can part ways (``serve --force-verify``, for sessions whose
    peers all run natively)."""
    check_fields(options)  # (a programmatic RelayOptions gets the bounds the flags get)
    task = package.task
    notes: list[str] = []
    changes: dict[str, Any] = {}
    verify = options.verify
    if config.mode == "async":
        if options.round_deadline is not None:
            raise SessionError("--round-deadline belongs to synchronous rounds; not with --mode async (settings "
                               "round_deadline, mode)")
        if verify or options.redundancy:
            checks = " and ".join(name for name, on in (("host replays", verify),
                                                         ("second copies", options.redundancy)) if on)
            notes.append(f"async mode: {checks} judge results against the version each started from, and a merge "
                         "waits for those of the results it takes; a failed one bans its peer and drops its results "
                         "not merged yet (what was merged stays: a stream has no rounds to merge again); backups are "
                         "a synchronous-round feature and are off")
    if task.kind == "local":
        if options.redundancy:
            raise SessionError(f"--redundancy compares two peers' results of one unit, but {task.name} "
                               "trains each unit on a peer's own files, so no two results can agree; start it "
                               "without --redundancy (setting redundancy)")
        if verify:
            notes.append(f"host replays are off: {task.name} trains on each peer's own files, which the host never "
                         "sees, so a result cannot be replayed; robust aggregation and the update checks remain")
            verify = False
        if not package.data.validation:
            notes.append("no validation split on the host: the session is judged by federated evaluation (the "
                         "peers' metrics of the weights each round starts from, on their own held-out examples)")
    if verify and not task.replay_across_engines and not force_verify:
        from server.browser_assets import engines  # (where the host can replay: the browser's engine, or native)

        engine, missing = engines.resolve(options.replay_engine, engines.host_only_task(package.manifest))
        if engine == "pyodide":
            notes.append(f"host replays run on the browser's own engine (Pyodide under Node) and compare {task.name} "
                         "results bit for bit; pages train this session on the CPU, whose bits a replay reproduces")
        else:
            notes.append(f"host replays are off: a {task.name} unit trained in a browser and natively can part ways "
                         "(float rounding differences grow into different weights), so a native replay cannot judge "
                         f"it, and the browser's engine is not available here ({missing or '--replay-engine native'});"
                         " the other checks remain")
            verify = False
    if verify and package.manifest.get("replayable") is False:
        raise SessionError(f"task {task.name} is not replayable: training unit 0 twice at set-up gave different "
                           "weights (does it read the clock or an unseeded generator?), so results cannot be "
                           "verified by replay; make train_unit depend only on (weights, unit, settings), or start "
                           "it with --no-verify (verify = false)")
    if config.codec == "auto":  # (SessionConfig.with_codec_for)
        config = config.with_codec_for(task.default_codec, compares=bool(verify or options.redundancy))
        if config.result_codec.compresses:
            notes.append(f"results and merged steps travel as {config.codec} ({task.name}'s default codec; "
                         "--codec none sends float32 weights)")
    codec = config.result_codec
    if not codec.comparable and (verify or options.redundancy):
        # Such a result (topk's carries the peer's error-feedback residual) is not what a host replay or a second
        # peer's copy of the unit gives: each would find it different and ban an honest peer.
        raise SessionError(f"--codec {codec.name} {codec.why_not_comparable}, which a host replay or a second peer's "
                           f"copy cannot reproduce; with {'host replays' if verify else '--redundancy'} on, choose "
                           f"--codec {codec.compared_fallback} (replays and copies compare its bytes), or run without "
                           "them (settings codec, verify, redundancy)")
    if verify != options.verify:
        changes["verify"] = verify
    resolved = dataclasses.replace(options, **changes) if changes else options  # type: ignore[type-var]
    return Resolution(config=config, options=resolved, notes=tuple(notes))
