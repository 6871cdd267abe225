"""Arithmetic problems for a small causal language model: ``"37+48=85"`` followed by an end-of-answer marker.

Which problems go where (all seeded by ``ArithSettings.seed``):
- Every operand pair (a, b) with both operands in ``[operand_min, operand_max]`` goes to exactly one side of
  ``split_pairs``: a held-out share (``heldout_fraction``, default 10%) and the training pairs; a held-out
  pair is never trained on, with any operator. The pairs of two one-digit operands (the fewest digits in range)
  are all trained on: the held-out share comes from the others.
- ``generate_problems``: ``num_examples`` problems drawn with replacement from the training pairs and
  the operators, 40 % of the operands (``width_balance``) digit count first, then value; the rest uniform over
  the range. Drawn uniformly from 0-99, both operands have one digit in 1 % of the problems, and the demo's
  model, 97 % right on random problems, got 41 of the 100 sums a+b (a, b in 0..9) right; with 40 % (6.8 % of
  the problems) it gets 100 and is as right on random problems. Even widths (1: a quarter of the problems)
  got the 100 too but only 41 % on random problems: too few two-digit pairs for the demo's training.
- ``validation_problems``: ``validation_size`` (200) problems drawn uniformly from the whole operand range
  (every pair equally likely: 81 % have two two-digit operands for 0-99, whatever ``width_balance`` is), a
  measure of fit. These MAY overlap the training problems: with 0-99 the range holds few enough problems that
  a model can memorise most of them, so this set measures fit, not generalisation.
- ``generalization_problems``: problems the model never saw: up to ``generalization_size`` problems on
  held-out pairs, plus ``beyond_range_size`` problems whose operands lie above the training range
  (100-999 for the default range: three-digit numbers).
- ``sample_problems``: a few problems to show, spread over the space: both operands of the fewest digits,
  both of the most, and held-out pairs.

Answers of ``-`` may be negative and carry a leading ``-`` (``"3-5=-2"``); ``*`` is the plain product.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from runtime.data.tokenizer import EOS, PAD, CharTokenizer, Tokenizer

SUPPORTED_OPERATORS = ("+", "-", "*")
IGNORE_INDEX = -100  # target value that the loss skips


class ArithError(ValueError):
    """Arithmetic data settings or inputs that cannot be used."""


@dataclass
class ArithSettings:
    operand_min: int = 0
    operand_max: int = 99
    operators: tuple[str, ...] = ("+",)
    num_examples: int = 10_000
    seed: int = 0
    chunks: int = 1
    end_token: str = EOS  # written after each answer: "<eos>", or "<eos>\n" for one problem per line
    heldout_fraction: float = 0.1
    validation_size: int = 200
    generalization_size: int = 200
    beyond_range_size: int = 50
    width_balance: float = 0.4

    def __post_init__(self) -> None:
        self.operators = tuple(self.operators)
        unknown = [op for op in self.operators if op not in SUPPORTED_OPERATORS]
        if not self.operators or unknown:
            raise ArithError(f"operators must be a non-empty subset of {SUPPORTED_OPERATORS}, got {self.operators}")
        if not 0 <= self.operand_min <= self.operand_max:
            raise ArithError(f"need 0 <= operand_min <= operand_max, got {self.operand_min}, {self.operand_max}")
        if self.num_examples < 1 or self.chunks < 1 or self.chunks > self.num_examples:
            raise ArithError(f"need 1 <= chunks <= num_examples, got {self.chunks}, {self.num_examples}")
        if self.end_token not in (EOS, EOS + "\n"):
            raise ArithError(f"end_token must be {EOS!r} or {EOS + chr(10)!r}, got {self.end_token!r}")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ArithError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        if not 0.0 <= self.width_balance <= 1.0:
            raise ArithError(f"width_balance must be in [0, 1], got {self.width_balance}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ArithSettings:
        data = json.loads(text)
        data["operators"] = tuple(data["operators"])
        return cls(**data)


class Problem(NamedTuple):
    a: int
    op: str
    b: int
    answer: str

    @property
    def prompt(self) -> str:
        return f"{self.a}{self.op}{self.b}="

    def text(self, end_text: str = EOS) -> str:
        return f"{self.prompt}{self.answer}{end_text}"


def compute_answer(a: int, op: str, b: int) -> str:
    if op == "+":
        return str(a + b)
    if op == "-":
        return str(a - b)
    if op == "*":
        return str(a * b)
    raise ArithError(f"unsupported operator {op!r}; use one of {SUPPORTED_OPERATORS}")


def make_problem(a: int, op: str, b: int) -> Problem:
    return Problem(a, op, b, compute_answer(a, op, b))


def _rng(settings: ArithSettings, purpose: int) -> np.random.Generator:
    """An independent stream per purpose, so changing one set's size never reshuffles another."""
    return np.random.default_rng(np.random.SeedSequence(settings.seed, spawn_key=(purpose,)))


def arith_alphabet(settings: ArithSettings) -> str:
    """Every character the problems use: digits, the operators and '=' (only '-' makes negative answers)."""
    return "0123456789" + "".join(settings.operators) + "=" + ("\n" if "\n" in settings.end_token else "")


def char_tokenizer(settings: ArithSettings) -> CharTokenizer:
    """The tokenizer that learns sums: no merges, every digit, operator and '=' its own token, and a real ``<eos>``
    (a BPE glues digits to operators and the end marker, and the model then never learns the sums)."""
    return CharTokenizer.build(arith_alphabet(settings), end_text=settings.end_token)


def split_pairs(settings: ArithSettings) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train pairs, held-out pairs): a seeded, disjoint split of every operand pair in range.

    Where the range spans more than one digit count, the pairs whose operands both have the fewest digits (0+0 to
    9+9 for 0-99: the table a person knows by heart, and the first thing anyone types into the model) are always
    trained on; the held-out share is drawn from the other pairs, in the same seeded order. Held out at random, 13
    of the 100 one-digit sums went unseen and the demo's model got one of them wrong (8+0=9) while the 87 it saw
    were right; the held-out score still measures 1,000 unseen pairs (for 0-99)."""
    values = range(settings.operand_min, settings.operand_max + 1)
    pairs = [(a, b) for a in values for b in values]
    order = _rng(settings, 0).permutation(len(pairs))
    n_heldout = int(round(settings.heldout_fraction * len(pairs)))
    if n_heldout >= len(pairs):
        raise ArithError("the held-out share leaves no training pairs")
    fewest = min(len(str(v)) for v in values)
    table = {i for i, (a, b) in enumerate(pairs) if len(str(a)) == fewest and len(str(b)) == fewest}
    if len(table) < len(pairs) and n_heldout <= len(pairs) - len(table):
        order = np.concatenate([[i for i in order if i not in table], [i for i in order if i in table]])
    heldout = sorted(pairs[i] for i in order[:n_heldout])
    train = sorted(pairs[i] for i in order[n_heldout:])
    return train, heldout


def operand_weights(settings: ArithSettings) -> np.ndarray:
    """The chance of each operand value ``operand_min ... operand_max`` in the training problems, shape (V,).

    A share ``width_balance`` of the operands takes a digit count first (each count in the range equally likely),
    then a value of that many digits; the rest take any value in the range. For 0-99 and balance 0.4 (the
    default) each one-digit value has 2.6 % and each two-digit value 0.82 %; for balance 0 every value 1 %, for
    balance 1 one-digit values 5 % and two-digit ones 0.56 %."""
    values = np.arange(settings.operand_min, settings.operand_max + 1)
    widths = np.array([len(str(v)) for v in values.tolist()])
    _, width_index, width_counts = np.unique(widths, return_inverse=True, return_counts=True)
    by_width = 1.0 / (len(width_counts) * width_counts[width_index])
    balance = settings.width_balance
    return balance * by_width + (1.0 - balance) / len(values)


def _draw(pairs: list[tuple[int, int]], operators: tuple[str, ...], n: int, rng: np.random.Generator,
          weights: np.ndarray | None = None) -> list[Problem]:
    """``n`` problems on ``pairs`` drawn with replacement, uniformly or in proportion to ``weights`` (one a pair)."""
    if weights is None:
        pair_idx = rng.integers(0, len(pairs), size=n)
    else:
        pair_idx = rng.choice(len(pairs), size=n, p=weights / weights.sum())
    op_idx = rng.integers(0, len(operators), size=n)
    return [
        make_problem(pairs[p][0], operators[o], pairs[p][1])
        for p, o in zip(pair_idx.tolist(), op_idx.tolist(), strict=True)
    ]


def generate_problems(settings: ArithSettings) -> list[Problem]:
    """``num_examples`` training problems drawn with replacement from the training pairs, a pair (a, b) in proportion
    to ``operand_weights``' chances of a and of b (uniformly where those are equal: the same draws as before
    ``width_balance`` existed)."""
    train, _ = split_pairs(settings)
    chance = operand_weights(settings)
    weights = None
    if not np.allclose(chance, chance[0]):
        low = settings.operand_min
        weights = np.array([chance[a - low] * chance[b - low] for a, b in train])
    return _draw(train, settings.operators, settings.num_examples, _rng(settings, 1), weights)


def chunk_problems(problems: list[Problem], chunks: int) -> list[list[Problem]]:
    """Contiguous, equal-ish chunks (sizes differ by at most one)."""
    if not 1 <= chunks <= len(problems):
        raise ArithError(f"cannot cut {len(problems)} problems into {chunks} chunks")
    bounds = np.linspace(0, len(problems), chunks + 1).round().astype(int).tolist()
    return [problems[bounds[i] : bounds[i + 1]] for i in range(chunks)]


def validation_problems(settings: ArithSettings) -> list[Problem]:
    """``validation_size`` problems from the whole training range; they may overlap the training problems."""
    values = range(settings.operand_min, settings.operand_max + 1)
    pairs = [(a, b) for a in values for b in values]
    return _draw(pairs, settings.operators, settings.validation_size, _rng(settings, 2))


def generalization_problems(settings: ArithSettings) -> list[Problem]:
    """Problems never trained on: held-out pairs, then operands above the range (100-999 by default)."""
    _, heldout = split_pairs(settings)
    rng = _rng(settings, 3)
    chosen = rng.permutation(len(heldout))[: settings.generalization_size].tolist()
    ops = rng.integers(0, len(settings.operators), size=len(chosen)).tolist()
    problems = [
        make_problem(heldout[i][0], settings.operators[o], heldout[i][1]) for i, o in zip(chosen, ops, strict=True)
    ]
    low = settings.operand_max + 1
    high = max(999, 10 * low - 1)
    a = rng.integers(low, high + 1, size=settings.beyond_range_size).tolist()
    b = rng.integers(low, high + 1, size=settings.beyond_range_size).tolist()
    ops = rng.integers(0, len(settings.operators), size=settings.beyond_range_size).tolist()
    problems += [make_problem(x, settings.operators[o], y) for x, o, y in zip(a, ops, b, strict=True)]
    return problems


def sample_problems(settings: ArithSettings, count: int) -> tuple[list[Problem], list[bool]]:
    """``count`` problems to show and whether each is on a held-out pair, seeded and fixed for a session: in turn a
    trained pair of the range's shortest operands (``3+5``), a trained pair of its longest (``37+48``) and a
    held-out pair (any widths), so the first three, six, ... cover the space evenly."""
    train, heldout = split_pairs(settings)
    shortest, longest = len(str(settings.operand_min)), len(str(settings.operand_max))
    kinds = [
        ([p for p in train if len(str(p[0])) == len(str(p[1])) == shortest], False),
        ([p for p in train if len(str(p[0])) == len(str(p[1])) == longest], False),
        (heldout, True),
    ]
    kinds = [(pairs, held) for pairs, held in kinds if pairs] or [(train, False)]  # (e.g. no held-out pairs)
    rng = _rng(settings, 4)
    orders = [rng.permutation(len(pairs)).tolist() for pairs, _ in kinds]
    problems, held_out = [], []
    for turn in range(count):
        (pairs, held), order = kinds[turn % len(kinds)], orders[turn % len(kinds)]
        a, b = pairs[order[(turn // len(kinds)) % len(order)]]
        problems.append(make_problem(a, settings.operators[turn % len(settings.operators)], b))
        held_out.append(held)
    return problems, held_out


def make_lm_examples(tokenizer: Tokenizer, problems: list[Problem], context: int) -> tuple[np.ndarray, np.ndarray]:
    """Causal-LM arrays: inputs (N, T) int32 padded with ``<pad>``, targets (N, T) int32 = the next token.

    Each problem is written ``prompt + answer + tokenizer.end_text``. A target counts only when its token
    holds a character of the answer or the end marker; prompt targets and padding are ``IGNORE_INDEX``
    (-100). A token that straddles the '=' (like a glued "8=8") counts, since it holds answer characters.
    """
    n = len(problems)
    inputs = np.full((n, context), tokenizer.pad_id, dtype=np.int32)
    targets = np.full((n, context), IGNORE_INDEX, dtype=np.int32)
    for row, problem in enumerate(problems):
        pieces = tokenizer.pieces(problem.text(tokenizer.end_text))
        if len(pieces) - 1 > context:
            raise ArithError(
                f"{problem.text(tokenizer.end_text)!r} needs {len(pieces) - 1} positions, context is {context}"
            )
        ids = [tokenizer.token_id(p) for p in pieces]
        ends = np.cumsum([len(p) for p in pieces])  # character offset where each token ends
        prompt_len = len(problem.prompt)
        for j in range(len(ids) - 1):
            inputs[row, j] = ids[j]
            if ends[j + 1] > prompt_len:
                targets[row, j] = ids[j + 1]
    return inputs, targets


def parse_answer(tokenizer: Tokenizer, generated_ids: list[int] | np.ndarray) -> str:
    """The answer in ids generated after the prompt: the decoded text up to the end marker (or newline/pad)."""
    text = tokenizer.decode(np.asarray(generated_ids, dtype=np.int64).tolist())
    for stop in (EOS, "\n", PAD):
        text = text.split(stop, 1)[0]
    return text.strip()


def exact_match(answers: list[str], problems: list[Problem]) -> float:
    """Share of answers that equal the true answer exactly."""
    if len(answers) != len(problems):
        raise ArithError(f"{len(answers)} answers for {len(problems)} problems")
    return sum(a == p.answer for a, p in zip(answers, problems, strict=True)) / max(1, len(problems))
