"""Undoing what a banned peer moved (``BanUndo``, a part of the relay): a ban merges again, without the banned peer's
results, the rounds since its last result that passed a host replay.

A ban (``server.relay.bans``) drops the banned peer's results of the open round, but its earlier accepted results are
in the global weights already. So the ban also asks for an undo, stored in SQLite beside it. The first round redone is
the first one after the peer's last replay-verified result that holds one of its results (``Store.unverified_rounds``,
from the results' verification column). The session goes back to its checkpoint before that round
(``Session.rewind``), and each round from there to the open one is merged again from the stored result messages,
without the banned peer's (marked undone in the audit). The other peers' results of those rounds were trained from the
poisoned weights; each goes in as it is, as its update (the result minus the weights it was trained from, read from
the set-aside checkpoint) added to the round's corrected weights (in float32; a round whose weights did not change
takes its results unchanged, bit for bit). The merge method's state (FedAvgM's momentum, FedAdam's moments), the
aggregator's and the downloads' residual come from the same checkpoint, so the redone rounds step as if the banned peer
had never taken part; the global weights, checkpoints and history roll forward from there. The banned peer's units
move into the open round (carried, still once per pass). The open round starts again from the corrected weights: its
results were trained from the poisoned ones, so they and its leases go (a peer still training one is refused and asks
again), and its job names the corrected weights by digest, so a peer holding the poisoned ones fetches them whole
(the step log is cleared: no chain starts from weights no longer served). Where a redone round would hold no result
at all, the undo stops there: that round and the later ones are handed out again from the plan.

The history gets an event on the last redone round, ``{"type": "undo", "peer", "rounds", "results", "carried",
"verified_through", "not_redone", "handed_out_again"}``; the relay counts ``undos``, ``rounds_redone``,
``results_undone`` and ``undos_partial`` / ``undos_refused``.

Bound: ``--undo-rounds R`` (default 16). Only the last R merged rounds are redone; for them the relay keeps the result
messages (``--keep-results`` at least R) and R + 1 checkpoint folders (``--keep-checkpoints`` at least R + 1). The
banned peer's results in older rounds (or rounds whose messages or checkpoint are gone) stay merged; the event lists
them as ``not_redone``.

Refused, and said so in the history: with differential privacy (the accountant has counted the rounds released, and
merging them again would release the same users' data a second time; clipping and noise already bound what one peer
moves); in async mode (merges of a stream, not rounds: a replayed result waits for its verdict before it is merged, and
a ban drops its peer's results not merged yet: ``server.relay.arrival_checks``);
a session without checkpoints on disk.

Crash safety: the undo's state (pending, running, rewound, done) and its plan are in SQLite, and the files move in an
order a crash may stop anywhere (``checkpoint_files.rewind_files``); on start the relay finishes an undo it had begun
before it hands anything out. A ban that comes while a merge runs waits for it (the relay runs undos under the merge's
lock): the round being merged keeps the banned peer's result, and the undo that follows merges that round again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime import wire
from runtime.planner import Assignment
from runtime.tasks import UnitResult
from server.relay.book import RoundBook
from server.relay.checks import decode_result
from server.relay.context import Part, RelayContext
from server.relay.jobs import Jobs
from server.relay.replay_checks import ReplayChecks
from server.relay.undo_rules import UndoRules
from server.session import checkpoint_files as checkpoint

LOG = logging.getLogger("peertrain.relay")
REBASED = "rebased_onto"  # a kept result an undo stored: the digest of the weights it stands on (its round's)
RELAY_FIELDS = ("verification", "deadline", "redundancy", "backups", "blocked")  # a redone entry keeps the relay's


def rebase(result: np.ndarray, trained_from: np.ndarray, corrected: np.ndarray) -> np.ndarray:
    """A result trained from ``trained_from`` moved onto ``corrected``: its update added to the corrected weights, in
    float32 (the result itself where the weights did not change)."""
    if np.array_equal(trained_from, corrected):
        return result
    return (corrected + (result - trained_from)).astype(np.float32)


class BanUndo(Part):
    """``rules`` say whether an undo may run (``server.relay.undo_rules``); ``schedule`` asks the relay to run the undo
    soon (before its next merge); ``begin`` / ``redo_blocking`` / ``end`` run it: on the event loop, in a worker
    thread (or inline), on the event loop again."""

    def __init__(self, context: RelayContext, *, rules: UndoRules, book: RoundBook, jobs: Jobs, replays: ReplayChecks,
                 schedule: Callable[[], None]) -> None:
        self.context, self.rules, self.book, self.jobs, self.replays = context, rules, book, jobs, replays
        self.schedule = schedule
        self.running: tuple[str, str, dict[str, Any]] | None = None  # (peer, state, plan) of the undo under way

    # -- when an undo runs ------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.rules.active

    def retain(self) -> None:
        """Keep the checkpoints an undo goes back to (the result messages: ``StorageGuard.prune_results``)."""
        if self.active:
            self.session.checkpoints_kept = max(self.session.config.keep_checkpoints, self.options.undo_rounds + 1)

    def request(self, peer_id: str) -> None:
        """A ban asks for its peer's merged results to be undone (stored: a restart still does it)."""
        if self.options.undo_rounds > 0:
            self.store.request_undo(peer_id)
            self.schedule()

    def pending(self) -> bool:
        return self.options.undo_rounds > 0 and bool(self.store.undos())

    # -- running one --------------------------------------------------------------------------------------------
    def begin(self) -> bool:
        """Take the next undo (on the event loop, or inline): plan a pending one, start the open round again and mark
        the relay merging (nothing is handed out). False when none is left to run."""
        for peer_id, state, plan in self.store.undos():
            if state == "pending":
                planned = self._plan(peer_id)
                if planned is None:
                    continue
                state, plan = "running", planned
            dropped = sum(self.store.reset_round(r) for r in range(plan["end"], plan["open"] + 1))
            if dropped:
                self.store.count("results_dropped_by_undo", dropped)
            self.book.forget_from(plan["end"])
            self.replays.forget_before(plan["open"] + 1)  # (replays prepared from the poisoned weights)
            self.context.merging = True
            self.running = (peer_id, state, plan)
            self.context.notices.changed()
            return True
        return False

    def _plan(self, peer_id: str) -> dict[str, Any] | None:
        """Which rounds to redo for ``peer_id`` (stored, with its results marked undone), or None when there is
        nothing to redo (said in the history where something stays merged)."""
        session, store, bound = self.session, self.store, self.options.undo_rounds
        verified, rounds = store.unverified_rounds(peer_id)
        open_round = session.round
        merged = [r for r in rounds if r < open_round]
        refusal = self.rules.refusal() if merged else None
        start = max(open_round - bound, 0)
        start = max([start, *(r + 1 for r in store.pruned_rounds(start, open_round))])
        directory = session.directory
        while directory is not None and start < open_round and not checkpoint.round_folder(directory, start).is_dir():
            start += 1
        redo = [r for r in merged if r >= start] if refusal is None else []
        facts: dict[str, Any] = {"type": "undo", "peer": peer_id, "verified_through": verified,
                 "not_redone": [r for r in merged if r not in redo]}
        if not redo:
            if merged:
                store.count("undos_refused" if refusal else "undos_partial")
                self._finish(peer_id, {**facts, "rounds": [], **({"refused": refusal} if refusal else {})})
            else:  # (nothing of it merged: the ban dropped all there was)
                store.set_undo(peer_id, "done", facts)
            return None
        assert directory is not None
        first = redo[0]
        removed = store.mark_undone(peer_id, first, open_round)
        end = next((r for r in range(first, open_round) if not set(store.result_slots(r)) - store.undone_slots(r)),
                   open_round)  # (a round left without results, and the later ones, are handed out again)
        checkpoint.discard_set_aside(directory)  # (what an undo finished before a crash left behind)
        plan = {**facts, "first": first, "end": end, "open": open_round, "results": removed,
                "carried": dict[str, list[list[int]]]()}
        store.set_undo(peer_id, "running", plan)
        LOG.warning("undoing peer %s: rounds %d to %d merged again without its %d results", peer_id, first + 1, end,
                    removed)
        return plan

    def redo_blocking(self) -> None:
        """Rewind the session and merge the planned rounds again (a worker thread, or inline)."""
        assert self.running is not None
        peer_id, state, plan = self.running
        session, store = self.session, self.store
        carried: dict[str, list[list[int]]] = plan["carried"]  # round -> the banned peer's units there (pass, unit,
        #                                                         round first planned), carried into the open round
        directory = session.directory
        assert directory is not None
        first, end = int(plan["first"]), int(plan["end"])
        if state == "running":
            session.rewind(first)
            store.set_undo(peer_id, "rewound", plan)
        originals = checkpoint.set_aside_history(directory)
        for _ in range(end - session.round):
            if session.done:
                break
            round_index = session.round
            assignments = {a.slot: a for a in session.assignments()}
            stored, undone = store.results(round_index), store.undone_slots(round_index)
            mine = [a for slot, a in sorted(assignments.items()) if slot in undone and stored[slot].peer_id == peer_id]
            carried[str(round_index)] = [[a.pass_index, a.unit_index, self._first_planned(a)] for a in mine]
            store.set_undo(peer_id, "rewound", plan)  # (before the round's checkpoint: a crash redoes it alike)
            carry = [(a.pass_index, a.unit_index, self._first_planned(a)) for slot, a in sorted(assignments.items())
                     if slot not in stored]  # (units the round merged without at first: carried as they were)
            if round_index == end - 1:  # the banned peer's units go to the open round, oldest first
                carry += [(p, u, r) for key in sorted(carried, key=int) for p, u, r in carried[key]]
            trained_from = session.weights if round_index == first else \
                checkpoint.set_aside_weights(directory, round_index)
            results, kept = [], {}
            corrected = wire.weights_digest(session.weights)  # (once a round: the weights its kept results stand on)
            for slot, result in sorted(stored.items()):
                if slot not in undone:
                    header, moved = self._moved(result.message, round_index, session.weights if trained_from is None
                                                else trained_from, corrected)
                    results.append((assignments[slot], UnitResult(moved, result.num_examples, result.metrics)))
                    kept[slot] = wire.encode(moved, dataclasses.replace(header,
                                                                        meta={**header.meta, REBASED: corrected}))
            for slot, message in kept.items():  # (another undo, or this one after a crash, reads these, one by one)
                store.replace_message(round_index, slot, message)
            before = originals[round_index] if round_index < len(originals) else {}
            session.complete_round(results, extra={**{k: before[k] for k in RELAY_FIELDS if k in before},
                                                   "redone": {"undo_of": peer_id}}, carry_missing=True, carry=carry,
                                   contributors={slot: r.peer_id for slot, r in stored.items() if slot not in undone})
        event = {k: plan[k] for k in ("type", "peer", "verified_through", "not_redone", "results")}
        event |= {"rounds": list(range(first, end)), "handed_out_again": list(range(end, int(plan["open"]))),
                  "carried": [u for key in sorted(carried, key=int) for _, u, _ in carried[key]]}
        self._finish(peer_id, event)
        store.count("undos")
        store.count("rounds_redone", end - first)
        store.count("results_undone", int(plan["results"]))
        if plan["not_redone"]:
            store.count("undos_partial")
        checkpoint.discard_set_aside(directory)

    def _finish(self, peer_id: str, event: dict[str, Any]) -> None:
        """Record the undo in the history (once: a restart after it does not add it again) and mark it done."""
        history = self.session.history
        if history and not any(e.get("type") == "undo" and e.get("peer") == peer_id for e in history[-1]["events"]):
            self.session.note_event(event)
        self.store.set_undo(peer_id, "done", event)

    def _moved(self, message: bytes, round_index: int, trained_from: np.ndarray,
               corrected: str) -> tuple[wire.WireHeader, np.ndarray]:
        """A kept result of ``round_index`` moved onto the weights the round now starts from (``session.weights``):
        its update from the weights it was trained from added to them. A message an undo stored already stands on
        the weights it names (``REBASED``): the corrected weights of its round, those this undo set aside, or (after
        a crash mid-round) the ones it starts from again; ``corrected``: the digest of ``session.weights``."""
        session = self.session
        if wire.is_update(message):
            header, vector = decode_result(message, session=session, round_index=round_index, base=trained_from)
            return header, rebase(vector, trained_from, session.weights)
        header, vector = wire.decode(message, expect_spec=session.spec, expect_round=round_index)
        named = header.meta.get(REBASED)
        base = session.weights if named == corrected else trained_from
        if named is not None and named != corrected and named != wire.weights_digest(trained_from):  # (not expected)
            LOG.warning("a kept result of round %d stands on weights %s this undo does not hold", round_index, named)
        return header, rebase(vector, base, session.weights)

    def _first_planned(self, assignment: Assignment) -> int:
        carried = self.session.carried_from(assignment)
        return assignment.round if carried is None else carried

    def end(self) -> None:
        """After an undo ran (or failed): the jobs name the corrected weights, the rounds open again."""
        self.running = None
        self.jobs.forget()
        self.context.merging = False
        self.context.notices.work_changed()
