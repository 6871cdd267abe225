"""What the admin API changes on a relay: pause, resume and stop, and a new session in place of the current
one (``POST /api/admin/session``): ``SessionAdmin``, a part of the relay.

While a replacement moves the old session's files (its SQLite store closed, the new one not yet open) the relay
is ``replacing``: the endpoints answer ``503 replacing`` with a Retry-After instead of touching a closed store
(each such request was a 500, found by ``peertrain bench fuzz``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from server.relay.context import RelayContext
from server.relay.options import RelayOptions
from server.relay.refusal import Refusal
from server.relay.store import Store, open_store
from server.relay.store.location import archive_server_store
from server.session.archive import archive_session
from server.session.config import SessionConfig, config_from_request
from server.session.rules import resolve
from server.session.session import Session

# Passes x units a session request may plan: starting a session builds its whole schedule
# (``RoundPlan.schedule``), 10^5 entries in about 3 s, and 10^15 never, with the old store already closed.
MAX_PLANNED_UNITS = 1_000_000


class SessionAdmin:
    """``paused``: no work is handed out. ``pause_from``: the round from which it is paused (``pause-after-round``:
    the round being trained is handed out to its end and merged; no later one starts). Both live in the store: every
    relay serving the session keeps the host's pause, and so does a restart (a new session starts unpaused, on its
    own store). ``replacing``: the old
    session's files are moving (the endpoints answer 503 meanwhile). ``start_session`` is the relay's: serve a new
    session with its own store. ``merge_lock`` is the relay's merge lock: a replacement waits for a merge in flight
    and no merge starts during one."""

    def __init__(self, context: RelayContext, *, merge_lock: asyncio.Lock,
                 start_session: Callable[[Session, Store, RelayOptions], None]) -> None:
        self.context, self.merge_lock, self.start_session = context, merge_lock, start_session
        # The options the relay started with: every new session is resolved against them (a session in async mode
        # turns host replays off for itself, not for the sync session after it).
        self.asked_options = context.options
        self.replacing = False

    @property
    def paused(self) -> bool:
        return self.context.store.pause()[0]

    @property
    def pause_from(self) -> int | None:
        return self.context.store.pause()[1]

    def is_paused(self) -> bool:
        """Whether no work is handed out now: paused, or the round ``pause-after-round`` waited for has merged."""
        paused, pause_from = self.context.store.pause()
        return paused or (pause_from is not None and self.context.session.round >= pause_from)

    def clear_pause(self) -> None:
        self.context.store.set_pause(False, None)

    async def replace_session(self, request: dict[str, Any]) -> Path:
        """A new session on the same package from a session request (``POST /api/admin/session``): the
        current config with the request's fields replaced. Everything is checked (merge guard and
        hyperparameters included, by building the session in memory) before anything on disk changes, so a
        refused request leaves the running session as it was. Then the old session's files move to
        ``archive/NNN/`` and the new one starts in the same folder; its peers must join again (their
        tokens lived in the old SQLite file). Returns the archive folder."""
        session, package = self.context.session, self.context.package
        try:
            config = config_from_request(request, session.config)
            # The rules every way of starting a session goes through (serve and simulate call them too). Replays
            # the relay started with stay allowed: serve already applied the engines' rule (or was forced).
            resolution = resolve(config, self.asked_options, package, force_verify=self.asked_options.verify)
            config = resolution.config
            if not session.done and not request.get("replace"):
                raise Refusal(409, "session_running", "the current session is still running; stop it first or "
                              'send "replace": true')
            plan = Session(package, config).plan  # the dry build: raises on a refused merge or bad settings
        except (TypeError, ValueError) as error:  # SessionError, MergeGuardRefused, bad hyperparameters
            raise Refusal(422, "bad_session", str(error)) from error
        if plan.passes * plan.num_units > MAX_PLANNED_UNITS:
            raise Refusal(422, "bad_session", f"{plan.passes} passes over {plan.num_units} units plan more than "
                          f"{MAX_PLANNED_UNITS} units; ask for fewer passes")
        directory = session.directory
        if directory is None:
            raise Refusal(409, "no_session_folder", "this relay's session has no folder; it cannot be replaced")
        async with self.merge_lock:
            self.replacing = True
            try:
                archived = await asyncio.to_thread(self.replace_blocking, config, directory, resolution.options)
            finally:
                self.replacing = False
        self.context.notices.work_changed()
        return archived

    def replace_blocking(self, config: SessionConfig, directory: Path, options: RelayOptions) -> Path:
        """Archive the old session's files and start the new session in their folder (a worker thread)."""
        old = self.context.store
        old.close()
        archived = archive_session(directory)
        schema = archive_server_store(old.location)  # (a database server's tables: into a schema of their own)
        if schema is not None:
            (archived / "store.txt").write_text(f"this session's store: schema {schema} of its PostgreSQL database\n")
        session = Session.create(self.context.package, config, directory=directory,
                                 round_log=self.context.session.round_log)  # (its metrics: a new run of the same log)
        self.start_session(session, open_store(old.location, clock=old.clock), options)
        return archived

    def admin_action(self, action: str) -> None:
        """``pause``, ``pause-after-round`` (hand out the current round, paused or not, and pause once it has
        merged: the host reads each round before the next one starts, which a pause sent from outside cannot
        promise, since the next round is handed out the moment one merges), ``resume`` or ``stop`` (ends the
        session, recorded so a restart does not resume it)."""
        if action == "pause":
            self.context.store.set_pause(True, self.pause_from)
        elif action == "pause-after-round":  # (sent while paused: one round runs, then it pauses again)
            self.context.store.set_pause(False, self.context.session.round + 1)
        elif action == "resume":
            self.clear_pause()
        elif action == "stop":
            self.context.session.stop("stopped by the admin")
        else:
            raise Refusal(404, "unknown_action", f"no admin action {action!r}")
        self.context.notices.work_changed()
