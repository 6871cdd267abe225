"""A round's results summed as they arrive, in any order, to the same bits.

A relay with a thousand peers cannot hold a thousand results until the last one is in and then go over all of
them: that is k decoded vectors in memory and O(k n) work after the last result, while every peer waits. An
aggregator that goes over the results one at a time (the mean, centered clipping with one iteration) can instead
take each result's part when it arrives and forget the result; after the last one only O(n) work is left.

Arrival order differs from run to run, while the relay must reproduce the simulator, a restart and a ban's undo
bit for bit. A float64 running sum depends on the order of its terms, so the sum here is exact instead:
``ExactSum`` rounds every term once to a fixed grid (2^-40) and adds the grid counts as integers (one int64
limb while the terms are small, two past that), and integer addition does not care about order. Rounding a term
is the only loss: the mean of k terms is off by at most 2^-41 (4.5e-13) a weight, below float32's resolution of
any weight above 1e-5 in size (the float64 running sum it replaces was off by its own rounding, which followed the
order). A term may reach 2^46 (7e13) in one weight (its example count times its update), far beyond any update
the relay accepts (``--max-update-norm``). What the sum holds is the same whatever order its terms came in, and a
term taken out again (``subtract``) leaves exactly what was there before it.

``Stream`` is one round of an aggregator that streams (``Aggregator.streams``): it keeps, per result, its example
count and its distance from the round's center, and in ``total`` the sum of count x (update - center). Centered
clipping's radius (twice the median distance) is known only once every result is in; a result further than it
is then taken out of the sum and put back clipped, which needs its update again (``reread``): with honest peers
no result is that far, and an attacker's is read once more. The outcome equals the same arithmetic done on all
the results at once (``Aggregator.combine`` does exactly that, through a ``Stream``), whatever the order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from runtime.aggregate.checks import MergeError

GRID_BITS = 40  # a term is rounded to a multiple of 2^-GRID_BITS
LOW_BITS = 43  # the low limb holds the last LOW_BITS bits of the grid count; the high limb the rest
TERM_LIMIT = 2.0 ** (2 * LOW_BITS - GRID_BITS)  # |count x update| per weight (2^46); 2^20 such terms fit the limbs
MAX_TERMS = 2**20

STREAMED = np.empty(0, dtype=np.float32)  # a result's weights where they were summed when it arrived

HIGH_SCALE = 2.0 ** (GRID_BITS - LOW_BITS)
LOW_SCALE = 2.0**LOW_BITS
GRID_SCALE = 2.0**GRID_BITS
SINGLE_LIMIT = 2.0**22  # the peaks one int64 limb sums (2^22 x 2^40 = 2^62: no term's rounding reaches 2^63)


class TermTooLarge(MergeError):
    """A result's part of the sum is beyond what ``ExactSum`` holds (an update of norm near 2^30 / count)."""


@dataclass(frozen=True)
class Term:
    """One term of an ``ExactSum``, rounded to its grid (``ExactSum.term``): its grid count in one int64 limb
    (``single``, where the term is below ``SINGLE_LIMIT``) or in two, and its largest value (``peak``)."""

    peak: float
    single: np.ndarray | None = None
    high: np.ndarray | None = None
    low: np.ndarray | None = None

    def limbs(self) -> tuple[np.ndarray, np.ndarray]:
        """The count in two limbs (a one-limb term split at bit ``LOW_BITS``: the same integer)."""
        if self.single is None:
            assert self.high is not None and self.low is not None
            return self.high, self.low
        return split(self.single)


def split(count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An int64 grid count as (high, low) with low in [0, 2^LOW_BITS): high * 2^LOW_BITS + low == count."""
    high = count >> LOW_BITS  # (floor)
    return high, count - (high << LOW_BITS)


@dataclass
class ExactSum:
    """sum_i w_i x_i over float64 vectors of one length, the same bits in any order of adding and subtracting.

    Each term t = w x (computed in float64) is rounded to the nearest multiple of 2^-40 and its count of grid steps
    is added as an integer. While the terms added are small enough that their counts cannot leave int64 (the sum of
    their peaks below ``SINGLE_LIMIT``, 2^22), the count is one int64 limb: round(t 2^40). Past that it moves to two
    int64 limbs: high = trunc(t 2^-3) and low = round((t 2^-3 - high) 2^43), each at most 2^43 in size, so 2^20
    terms of |t| < 2^46 stay inside int64. Both hold the same integer (t 2^40 and t 2^-3 differ by a power of two:
    one rounding either way, and high 2^43 is even), and ``value`` reads the integer, so the bits do not depend on
    which limbs held it."""

    size: int
    single: np.ndarray | None = field(init=False, repr=False)
    _high: np.ndarray | None = field(default=None, init=False, repr=False)
    _low: np.ndarray | None = field(default=None, init=False, repr=False)
    bound: float = field(default=0.0, init=False)  # the sum of the peaks added or taken out (one limb while small)
    terms: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.single = np.zeros(self.size, dtype=np.int64)

    @property
    def limbs(self) -> tuple[np.ndarray, np.ndarray]:
        """The count in two limbs (high, low), the sum moved to two limbs if it held one."""
        return self._two_limbs()

    @limbs.setter
    def limbs(self, value: tuple[np.ndarray, np.ndarray]) -> None:
        self.single, (self._high, self._low) = None, value

    def _two_limbs(self) -> tuple[np.ndarray, np.ndarray]:
        if self.single is not None:
            self._high, self._low = split(self.single)
            self.single = None
        assert self._high is not None and self._low is not None
        return self._high, self._low

    def copy(self) -> ExactSum:
        copied = ExactSum(self.size)
        copied.single = None if self.single is None else self.single.copy()
        copied._high = None if self._high is None else self._high.copy()
        copied._low = None if self._low is None else self._low.copy()
        copied.bound, copied.terms = self.bound, self.terms
        return copied

    def add(self, vector: np.ndarray, weight: float = 1.0) -> None:
        self.add_term(self.term(vector, weight))

    def subtract(self, vector: np.ndarray, weight: float = 1.0) -> None:
        """Take out a term added before with the same vector and weight: what was there before it, exactly."""
        self.add_term(self.term(vector, weight), sign=-1)

    def term(self, vector: np.ndarray, weight: float = 1.0) -> Term:
        """``weight x vector`` rounded to the grid, as ``add_term`` adds it: the costly part of adding, which reads
        nothing of the sum (so it may run in another thread while the sum takes other terms)."""
        if vector.shape != (self.size,):
            raise ValueError(f"a term of shape {vector.shape} in a sum of {self.size} values")
        scaled = np.multiply(vector, weight * GRID_SCALE, dtype=np.float64)  # (a power of two: exact but for weight)
        peak = max(float(scaled.max(initial=0.0)), -float(scaled.min(initial=0.0))) / GRID_SCALE
        if not peak < TERM_LIMIT:  # (NaN too)
            raise TermTooLarge(f"a result's part of the merge reaches {peak:.3g} in one weight (count x update); "
                               f"at most {TERM_LIMIT:.3g} can be summed exactly")
        if peak < SINGLE_LIMIT:  # (a larger one goes to two limbs whatever the sum holds)
            np.rint(scaled, out=scaled)  # (the one rounding)
            return Term(peak, single=scaled.astype(np.int64))
        scaled *= 2.0**-LOW_BITS  # (t 2^-3: exact)
        truncated = np.trunc(scaled)
        scaled -= truncated  # (exact: the fraction of a float64)
        high = truncated.astype(np.int64)
        del truncated  # (three vectors at most at once: a relay computes terms in several threads)
        scaled *= LOW_SCALE
        np.rint(scaled, out=scaled)  # (the one rounding)
        return Term(peak, high=high, low=scaled.astype(np.int64))

    def add_term(self, term: Term, sign: int = 1) -> None:
        """Add (``sign`` 1) or take out (-1) a term from ``term``: integer additions."""
        shape = (term.single if term.single is not None else term.high).shape  # type: ignore[union-attr]
        if shape != (self.size,):
            raise ValueError(f"a term of shape {shape} in a sum of {self.size} values")
        if sign > 0 and self.terms >= MAX_TERMS:
            raise TermTooLarge(f"an exact sum holds at most {MAX_TERMS:,} terms")
        add = np.add if sign > 0 else np.subtract
        if self.single is not None and term.single is not None and self.bound + term.peak < SINGLE_LIMIT:
            add(self.single, term.single, out=self.single)
        else:
            high, low = self._two_limbs()
            term_high, term_low = term.limbs()
            add(high, term_high, out=high)
            add(low, term_low, out=low)
        self.bound += term.peak
        self.terms += sign

    def value(self) -> np.ndarray:
        """The sum in float64 (from the limbs with their carries moved up: the same integers give the same bits)."""
        if self.single is not None:
            high, low = split(self.single)
        else:
            assert self._high is not None and self._low is not None
            carry, low = split(self._low)  # (the low limb left in [0, 2^43))
            high = self._high + carry
        return high.astype(np.float64) / HIGH_SCALE + low.astype(np.float64) / (HIGH_SCALE * LOW_SCALE)


Reread = Callable[[Hashable], np.ndarray]


@dataclass(frozen=True)
class Contribution:
    """A result's part of one ``Stream`` (``Stream.prepare``): its count, its distance from the center and its
    term (None without examples)."""

    stream: Stream
    count: int
    distance: float
    term: Term | None


@dataclass
class Stream:
    """One round of a streaming aggregator: each result's part added as it comes (module docstring).

    ``global_weights`` (float64) and ``center`` (float64, the point updates are measured from: centered clipping's
    last aggregated update, zero for the mean) are fixed when the round opens. Keys name results (the relay: their
    slots) and must be unique; a result with zero examples is recorded but takes no part."""

    global_weights: np.ndarray
    center: np.ndarray
    total: ExactSum = field(init=False, repr=False)
    counts: dict[Hashable, int] = field(default_factory=dict, init=False)
    distances: dict[Hashable, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.total = ExactSum(self.global_weights.shape[0])

    def offset(self, vector: np.ndarray) -> np.ndarray:
        """A result's weights as its update from the center: (w - global) - center, in float64."""
        update = np.asarray(vector, dtype=np.float64) - self.global_weights
        update -= self.center
        return update

    def prepare(self, vector: np.ndarray, count: int) -> Contribution:
        """A result's part of the sum, computed without touching the sum: what ``add`` adds. It reads only what
        is fixed when the round opens, so a relay computes it in a worker thread as the result arrives."""
        if vector.shape != self.global_weights.shape:
            raise ValueError(f"a result of shape {vector.shape}, the weights {self.global_weights.shape}")
        offset = self.offset(vector)
        distance = float(np.sqrt(np.square(offset).sum()))
        return Contribution(self, int(count), distance, self.total.term(offset, float(count)) if count > 0 else None)

    def add(self, key: Hashable, vector: np.ndarray, count: int, contribution: Contribution | None = None) -> float:
        """Add a result (its weights, its example count; ``contribution``: its ``prepare``, where it was computed
        already); its distance from the center."""
        if key in self.counts:
            raise ValueError(f"result {key!r} is in this round's sum already")
        if contribution is None or contribution.stream is not self or contribution.count != int(count):
            contribution = self.prepare(vector, count)
        if contribution.term is not None:
            self.total.add_term(contribution.term)
        self.counts[key], self.distances[key] = contribution.count, contribution.distance
        return contribution.distance

    def rekey(self, keys: dict[Hashable, Hashable]) -> None:
        """Name the results anew (old key -> new key, one for each result in the sum)."""
        if keys.keys() != self.counts.keys() or len(set(keys.values())) != len(keys):
            raise ValueError("a new key for each result in the sum, each its own")
        self.counts = {keys[key]: count for key, count in self.counts.items()}
        self.distances = {keys[key]: distance for key, distance in self.distances.items()}

    def remove(self, key: Hashable, vector: np.ndarray) -> None:
        """Take a result out again (the same weights it was added with)."""
        count = self.counts.pop(key)
        del self.distances[key]
        if count > 0:
            self.total.subtract(self.offset(vector), float(count))

    def taking_part(self) -> list[Hashable]:
        """The keys of the results with examples, in the order of their keys (slot order for the relay)."""
        return sorted((key for key, count in self.counts.items() if count > 0), key=sort_key)

    def examples(self) -> int:
        return sum(self.counts.values())

    def clipped_mean(self, radius: float | None, reread: Reread) -> tuple[np.ndarray, list[Hashable]]:
        """(the center plus the example-weighted mean of the updates from it, each clipped to ``radius``, in
        float64; the keys clipped). ``radius`` None: no clipping (the mean). ``reread(key)``: a clipped result's
        weights again."""
        total_examples = self.examples()
        if total_examples <= 0:
            raise MergeError("a merge needs at least one result with examples")
        clipped = [] if radius is None else [k for k in self.taking_part() if self.distances[k] > radius]
        if clipped:
            assert radius is not None
            corrected = self.total.copy()
            for key in clipped:
                offset = self.offset(reread(key))
                count = float(self.counts[key])
                corrected.subtract(offset, count)
                offset *= radius / self.distances[key]
                corrected.add(offset, count)
            summed = corrected.value()
        else:
            summed = self.total.value()
        return self.center + summed / float(total_examples), clipped


def sort_key(key: Hashable) -> tuple[str, object]:
    """Keys of one kind sort among themselves (ints as ints)."""
    return (type(key).__name__, key)
