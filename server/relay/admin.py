"""What the admin API changes on a relay: pause, resume and stop, and a new session in place of the current
one (``POST /api/admin/session``): a mixin of ``Relay``.

While a replacement moves the old session's files (its SQLite store closed, the new one not yet open) the relay
is ``replacing``: the endpoints answer ``503 replacing`` with a Retry-After instead of touching a closed store
(each such request was a 500, found by ``peertrain bench fuzz``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from server.relay.refusal import Refusal
from server.relay.sqlite_store import Store
from server.session.archive import archive_session
from server.session.config import config_from_request
from server.session.session import Session

if TYPE_CHECKING:
    from server.session.package import Package

# Passes x units a session request may plan: starting a session builds its whole schedule
# (``RoundPlan.schedule``), 10^5 entries in about 3 s, and 10^15 never, with the old store already closed.
MAX_PLANNED_UNITS = 1_000_000


class SessionAdmin:
    """Needs from the relay: ``session``, ``package``, ``store``, ``paused``, ``_merge_lock``, ``start_session``
    and ``work_changed``."""

    session: Session
    package: Package
    store: Store
    paused: bool
    _merge_lock: asyncio.Lock
    replacing: bool = False  # the old session's files are moving: the endpoints answer 503 meanwhile

    if TYPE_CHECKING:
        def start_session(self, session: Session, store: Store) -> None: ...

        def work_changed(self) -> None: ...

    async def replace_session(self, request: Any) -> Path:
        """A new session on the same package from a session request (``POST /api/admin/session``): the
        current config with the request's fields replaced. Everything is checked (merge guard and
        hyperparameters included, by building the session in memory) before anything on disk changes, so a
        refused request leaves the running session as it was. Then the old session's files move to
        ``archive/NNN/`` and the new one starts in the same folder; its peers must join again (their
        tokens lived in the old SQLite file). Returns the archive folder."""
        try:
            config = config_from_request(request, self.session.config)
            if not self.session.done and not request.get("replace"):
                raise Refusal(409, "session_running", "the current session is still running; stop it first or "
                              'send "replace": true')
            plan = Session(self.package, config).plan  # the dry build: raises on a refused merge or bad settings
        except (TypeError, ValueError) as error:  # SessionError, MergeGuardRefused, bad hyperparameters
            raise Refusal(422, "bad_session", str(error)) from error
        if plan.passes * plan.num_units > MAX_PLANNED_UNITS:
            raise Refusal(422, "bad_session", f"{plan.passes} passes over {plan.num_units} units plan more than "
                          f"{MAX_PLANNED_UNITS} units; ask for fewer passes")
        directory = self.session.directory
        if directory is None:
            raise Refusal(409, "no_session_folder", "this relay's session has no folder; it cannot be replaced")
        async with self._merge_lock:
            self.replacing = True
            try:
                archived = await asyncio.to_thread(self._replace_blocking, config, directory)
            finally:
                self.replacing = False
        self.work_changed()
        return archived

    def _replace_blocking(self, config: Any, directory: Path) -> Path:
        self.store.close()
        archived = archive_session(directory)
        self.start_session(Session.create(self.package, config, directory=directory),
                           Store(directory / "relay.sqlite3", clock=self.store.clock))
        return archived

    def admin_action(self, action: str) -> None:
        """``pause``, ``resume`` or ``stop`` (ends the session, recorded so a restart does not resume it)."""
        if action == "pause":
            self.paused = True
        elif action == "resume":
            self.paused = False
        elif action == "stop":
            self.session.stop("stopped by the admin")
        else:
            raise Refusal(404, "unknown_action", f"no admin action {action!r}")
        self.work_changed()
