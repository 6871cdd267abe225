"""What every result goes through before it may reach the merge, after its lease was checked.

1. The wire message: fingerprint, round, spec, dtype, length, finite values (``runtime.wire.decode``).
2. The example count: the weight a result gets in the merge is the relay's, never the peer's claim. A data
   unit counts ``Task.unit_examples`` (from the package); an experience unit counts the peer's report,
   capped by ``Task.max_examples_per_unit``, and so does a local unit (the peer's own data, which the relay never
   sees: the cap is all it knows, not the chunk size). A claim above the relay's count is refused: an honest peer
   never makes one, and one inflated claim would otherwise outweigh every other result of the round.
3. The update's size, absolute: ``|result - global|`` above ``max_update_norm`` is refused.
4. The update's size relative to the round: once ``outlier_min_results`` results of the round are accepted,
   an update more than ``outlier_factor`` times their median norm is refused (a flipped and scaled update
   sits far out; honest updates of one round differ by well under 2x on the built-in tasks).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime import wire
from runtime.aggregate.streaming import Contribution
from runtime.privacy import noise_bound
from runtime.tasks import Task, WorkUnit
from server.relay.options import RelayOptions
from server.relay.refusal import Refusal
from server.relay.verify import matches
from server.session.session import Session


def decode_result(body: bytes, *, session: Session, round_index: int, fingerprint: str | None = None,
                  base: np.ndarray | None = None, base_sha256: str | None = None) -> tuple[wire.WireHeader, np.ndarray]:
    """A result message (weights, or an update in the session's codec against ``base``: the weights of the round
    it names, by default the current ones, whose sha256 ``base_sha256`` is where the caller has it) as its header and
    the weights it stands for; a ``Refusal`` names what is wrong."""
    parts = decode_parts(body, session=session, round_index=round_index, fingerprint=fingerprint, base=base,
                         base_sha256=base_sha256, identity=False)
    return parts.header, parts.weights


def decode_parts(body: bytes, *, session: Session, round_index: int, fingerprint: str | None = None,
                 base: np.ndarray | None = None, base_sha256: str | None = None,
                 identity: bool = True) -> wire.ResultParts:
    """``decode_result`` as ``wire.result_parts``: with the update the message carries and its weights identity."""
    try:
        return wire.result_parts(body, session.weights if base is None else base, codec=session.config.result_codec,
                                 expect_spec=session.spec, expect_round=round_index,
                                 expect_fingerprint=fingerprint, base_sha256=base_sha256, identity=identity)
    except wire.WireError as error:
        raise Refusal(int(getattr(error, "http_status", 400)), error.code, str(error)) from error


def engines_of(meta: Mapping[str, Any]) -> tuple[str, str]:
    """The engine and the engine class a result's header names (``runtime.peer``; a runtime older than engine
    classes names the engine only, which then stands for its class)."""
    engine = str(meta.get("engine", ""))
    return engine, str(meta.get("engine_class", "") or engine)


def read_result(body: bytes, *, session: Session, fingerprint: str, round_index: int, unit: WorkUnit,
                base: np.ndarray | None = None, base_sha256: str | None = None, norm: bool = True) -> Read:
    """The checks of 1-3 above: the header, the weights, the relay's example count and the update norm (against
    ``base``, by default the current weights, whose sha256 is ``base_sha256`` where the caller has it; NaN without
    ``norm``: the caller measures the update itself)."""
    base = session.weights if base is None else base
    header, vector = decode_result(body, session=session, round_index=round_index, fingerprint=fingerprint,
                                   base=base, base_sha256=base_sha256)
    return header, vector, relay_count(session.task, unit, int(header.num_examples)), \
        update_norm(vector, base) if norm else math.nan


Read = tuple[wire.WireHeader, np.ndarray, int, float]  # read_result's answer


@dataclass(frozen=True)
class EarlyRead:
    """A result message read in a worker thread when it arrived (``read_result`` against ``base``, and what else its
    round mode computes without touching the relay's state: its part of the round's sum, its update), so that the
    event loop, which every peer's request waits on, does only what changes state. ``outcome`` is the read or the
    refusal it raised. The loop uses it only while ``base`` is still the weights the result is judged against."""

    base: np.ndarray
    outcome: Read | Refusal
    contribution: Contribution | None = None
    update: np.ndarray | None = None
    digest: str | None = None  # (the message's sha256, for the audit)
    identity: str | None = None  # (its ``wire.weights_identity``: a second copy of the unit is compared by it)

    def answer(self) -> Read:
        if isinstance(self.outcome, Refusal):
            raise self.outcome
        return self.outcome


def read_early(body: bytes, *, session: Session, fingerprint: str, round_index: int, unit: WorkUnit,
               base: np.ndarray, base_sha256: str | None = None, norm: bool = True) -> Read | Refusal:
    """``read_result``'s answer, or the refusal it raised (kept for the event loop to raise)."""
    try:
        return read_result(body, session=session, fingerprint=fingerprint, round_index=round_index, unit=unit,
                           base=base, base_sha256=base_sha256, norm=norm)
    except Refusal as refusal:
        return refusal


def read_parts(body: bytes, *, session: Session, fingerprint: str, round_index: int, unit: WorkUnit,
               base: np.ndarray, base_sha256: str | None = None) -> tuple[wire.ResultParts, int] | Refusal:
    """What the asynchronous buffer reads of a result as it arrives, in one pass over its bytes: its parts
    (``decode_parts``) and the relay's example count, or the refusal raised (kept for the event loop to raise)."""
    try:
        parts = decode_parts(body, session=session, round_index=round_index, fingerprint=fingerprint, base=base,
                             base_sha256=base_sha256)
        return parts, relay_count(session.task, unit, int(parts.header.num_examples))
    except Refusal as refusal:
        return refusal


def relay_count(task: Task, unit: WorkUnit, claimed: int) -> int:
    """The example count the merge uses for this result (see the module docstring, 2)."""
    if claimed <= 0:
        raise Refusal(422, "num_examples", f"num_examples must be positive, got {claimed}")
    if task.kind == "data":
        known = task.unit_examples(unit)
        if claimed > known:
            raise Refusal(422, "num_examples_claim", f"unit {unit.index} holds {known} examples; the result "
                          f"claims {claimed}")
        return known
    cap = task.max_examples_per_unit()  # experience and local units: the peer's count, up to the cap
    if cap is not None and claimed > cap:
        what = "trains on at most" if task.kind == "local" else "yields at most"
        raise Refusal(422, "num_examples_claim", f"a unit of {task.name} {what} {cap} examples; the "
                      f"result claims {claimed}")
    return claimed


def update_norm(vector: np.ndarray, global_weights: np.ndarray) -> float:
    return float(np.linalg.norm(vector.astype(np.float64) - global_weights))


def check_update_norm(norm: float, accepted: Sequence[float], *, max_norm: float, outlier_factor: float,
                      min_results: int) -> None:
    """Refuse an update too large in itself or against the round's accepted ones (module docstring, 3-4)."""
    if not norm <= max_norm:
        raise Refusal(422, "update_norm", f"update norm {norm:.4g} exceeds the bound {max_norm}")
    if outlier_factor > 0 and len(accepted) >= max(1, min_results):
        median = statistics.median(accepted)
        if median > 0 and norm > outlier_factor * median:
            raise Refusal(422, "update_outlier", f"update norm {norm:.4g} is more than {outlier_factor:g} times "
                          f"the median {median:.4g} of this round's {len(accepted)} accepted updates")


def local_noise(meta: Mapping[str, Any], kind: str) -> tuple[float, float] | None:
    """The (noise multiplier, clip) a local task's result says its peer added of its own accord (local differential
    privacy, ``runtime.privacy.privatize_update``), or None; a malformed claim is refused (``local_dp``)."""
    claim = meta.get("local_dp")
    if claim is None or kind != "local":
        return None
    z, clip = (claim.get("noise_multiplier"), claim.get("clip")) if isinstance(claim, Mapping) else (None, None)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
               for v in (z, clip)):
        raise Refusal(422, "local_dp", f"local_dp must name a noise_multiplier and a clip above 0, got {claim!r}")
    return float(z), float(clip)  # type: ignore[arg-type]


def check_noised_norm(norm: float, noise: tuple[float, float], size: int, *, max_norm: float) -> None:
    """A locally noised update is not held to the round's median (its noise alone is z C sqrt(d) long), only to the
    norm its clip and noise reach but with probability e^-50 (``runtime.privacy.noise_bound``) and the absolute
    bound: a claim of noise buys a peer no more room than that noise takes."""
    bound = min(max_norm, noise_bound(*noise, size))
    if not norm <= bound:
        raise Refusal(422, "update_norm", f"update norm {norm:.4g} exceeds {bound:.4g}, the bound of its clip "
                      f"{noise[1]:g} and local noise multiplier {noise[0]:g} (and --max-update-norm)")


NOT_COVERED = ("a majority of dishonest peers", "the privacy of the data sent to peers", "trusted execution")


LOCAL_NOT_COVERED = ("results trained on peers' own files: they cannot be verified by replay (the host never sees "
                     "the data) nor by a second peer; robust aggregation and the update checks still apply, and the "
                     "federated metrics are the peers' own reports")


NO_REPLAYS = ("results are not re-trained on the host in this session (host replays are off), so a peer whose "
              "result is wrong but not unusually large is neither caught nor banned")


ASYNC_BANS = ("async mode merges a stream, not rounds: a banned peer's results merged before its ban stay merged "
              "(a replayed or copied result waits for its verdict or its copy before it is merged, and every peer's "
              "first is replayed or copied)")


def describe_defenses(options: RelayOptions, aggregate: str, aggregate_config: Mapping[str, Any],
                      kind: str = "data", replays: Mapping[str, Any] | None = None, *,
                      stream: bool = False) -> dict[str, Any]:
    """The page's list of what the session's settings (``RelayOptions``) defend against, and what not (a local
    task's results, which no replay can check, say so; ``stream``: async mode, whose bans undo nothing merged)."""
    settings = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in aggregate_config.items())
    guards = [f"results are combined by {aggregate}" + (f" ({settings})" if settings else ""),
              "example counts come from the relay, never from a peer's claim",
              f"updates above norm {options.max_update_norm:g}"
              + (f" or {options.outlier_factor:g}x the round's median are refused" if options.outlier_factor > 0
                 else " are refused"),
              "joins per address: " + (f"{options.join_burst} at once, then {options.join_rate:g}/s"
                                       if options.join_rate > 0 else "no limit")
              + (f", at most {options.max_peers_per_address} live peers" if options.max_peers_per_address > 0
                 else "")]
    local = kind == "local"
    if options.verify and not local:
        engine = (replays or {}).get("engine")
        how = (" on the browser's own engine (Pyodide): a result trained on a browser's CPU must be identical, bit "
               "for bit" if (replays or {}).get("exact") else
               f" natively ({engine}), within a tolerance" if engine else "")
        guards.append("results are re-trained on the host and compared (every peer's first, "
                      f"{options.verify_fraction:.0%} of the rest" + ("" if stream else ", and outliers")
                      + f"){how}; a peer whose result differs is banned")
    if options.verify and not local:
        trusting = options.verify_trust > options.verify_every > 0
        trust = (f"; each replay it passes in a row doubles that, up to {options.verify_trust}, and halves its share "
                 "of random replays") if trusting else ""
        guards += [f"no peer goes more than {options.verify_every} results without a replay (which one is drawn in "
                   f"secret){trust}"] if options.verify_every > 0 else []
        guards += [f"an update pointing away from its round's others (cosine below {options.verify_direction:g}) "
                   "or that does not move the model is always replayed"] if options.verify_direction is not None \
            and not stream else []
    if options.redundancy > 0 and not local:
        guards.append(f"{options.redundancy:.0%} of units are trained by two different peers and compared; the "
                      "one whose result is wrong is banned")
    not_covered = list(NOT_COVERED) + ([LOCAL_NOT_COVERED] if local else [])
    if not options.verify and not local:
        not_covered.append(NO_REPLAYS)
    if stream and not local and (options.verify or options.redundancy > 0):
        not_covered.append(ASYNC_BANS)
    return {"guards": guards, "not_covered": not_covered}


def identical_messages(task: Task, result: tuple[str, bytes | str], other: tuple[str, bytes | str]) -> bool:
    """Two result messages of one unit from one set of weights, each (engine class, message or its
    ``wire.weights_identity``), that are identical by their bytes alone: one engine class, and weights of the same
    bytes (``wire.same_weights``, or one identity). A copy that agrees costs a comparison of bytes, not a decode of
    both (on the event loop, half its time at a thousand peers); of identities, not even a read of the first."""
    if task.kind == "local" or not result[0] or result[0] != other[0]:
        return False
    first, second = result[1], other[1]
    if isinstance(first, str) or isinstance(second, str):
        return first == second
    return wire.same_weights(first, second)


def compare_copy(session: Session, options: RelayOptions, copy: tuple[str, bytes, np.ndarray], first: bytes, *,
                 round_index: int, base: np.ndarray,
                 base_sha256: str | None = None) -> tuple[str, np.ndarray, str, str]:
    """A result (its engine class, message and weights) compared with another of its unit from ``base``, as that
    one's message ``first``: (``compare_results``' outcome, the other's weights, engine and engine class). Identical
    bytes are not decoded (``identical_messages``)."""
    engine, engine_class = engines_of(wire.read_header(first).meta)
    if identical_messages(session.task, (copy[0], copy[1]), (engine_class, first)):
        return "identical", copy[2], engine, engine_class
    weights = decode_result(first, session=session, round_index=round_index, base=base, base_sha256=base_sha256)[1]
    return compare_results(session.task, options, (copy[0], copy[2]), (engine_class, weights), base), weights, engine, \
        engine_class


AGREE = ("identical", "agreed")  # the outcomes of ``compare_results`` that say two results agree


def compare_results(task: Task, options: RelayOptions, result: tuple[str, np.ndarray], other: tuple[str, np.ndarray],
                    base: np.ndarray) -> str:
    """Two results of one unit from one set of weights (``base``), each (engine class, weights): bit for bit within
    one engine class, within the replay tolerance across classes where the task's training is reproducible across
    engines, else not comparable."""
    if task.kind == "local":  # a backup of a local unit trained on another peer's own files
        return "not_comparable"
    if result[0] and result[0] == other[0]:
        return "identical" if np.array_equal(result[1], other[1]) else "disputed"
    if not task.replay_across_engines:
        return "not_comparable"
    ok, _ = matches(result[1], other[1], base, rtol=options.verify_rtol, atol=options.verify_atol)
    return "agreed" if ok else "disputed"
