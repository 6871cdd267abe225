"""Whether this session's bans can be undone (``UndoRules``), and why not where they cannot.

Two parts of the relay ask: ``BanUndo`` (``server.relay.undo``), which runs the undos, and ``ReplayChecks``
(``server.relay.replay_checks``), which lets a routine replay be judged after its round's merge only where a failure
could still be undone. The answer depends only on the session served and the relay's options, so the relay builds
one ``UndoRules`` first and hands it to both.
"""

from __future__ import annotations

from server.relay.context import Part, RelayContext


class UndoRules(Part):
    def __init__(self, context: RelayContext) -> None:
        self.context = context

    def refusal(self) -> str | None:
        """Why this session's bans cannot be undone (None: they can)."""
        session = self.session
        if self.context.async_mode:
            return ("async mode merges a stream, not rounds, so a ban undoes nothing merged (a replayed result is "
                    "held out of the merges until its verdict, and a ban drops its peer's results not merged yet)")
        if session.privacy is not None:
            return ("differential privacy: the accountant has counted the rounds released, and merging them again "
                    "would release the same users' data a second time; clipping and noise bound one peer's effect")
        if session.directory is None:
            return "the session keeps no checkpoints to go back to"
        return None

    @property
    def active(self) -> bool:
        """A ban undoes what its peer moved (``--undo-rounds`` above 0, and nothing refuses it)."""
        return self.options.undo_rounds > 0 and self.refusal() is None
