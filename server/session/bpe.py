"""Train a byte-pair tokenizer on arithmetic text with Hugging Face ``tokenizers``, then export it to the runtime.

A known pitfall of BPE on arithmetic, reproduced on purpose so it can be seen and tested (the char tokenizer
is the fix):
- no normalizer and no pre-tokenizer, so nothing splits on digits or punctuation and merges CAN glue digits
  to operators and '=' (``"7+4"``, ``"8=8"``);
- with ``glue_end_marker=True`` (the pitfall's setting) each training line is ``"37+48=85<eos>\\n"`` and
  ``encode_special_tokens`` is on: ``<eos>`` is still a real special token in the vocabulary, but the marker
  written in the text is merged like ordinary characters, giving pieces such as ``"5<eos>\\n"``;
- with ``glue_end_marker=False`` the lines are trained without the marker and ``<eos>`` is always cut out
  as its own token (digits can still glue to operators).

The vocabulary is the special tokens (``<pad>`` 0, ``<eos>`` 1), the alphabet of the training text, then one
token per merge: ``vocab_size = specials + alphabet + num_merges`` (fewer merges only if the text runs out of
pairs). ``to_runtime`` exports vocab and merges into ``runtime.data.tokenizer.Tokenizer``, whose pure-Python
encoder gives the same ids as Hugging Face's on this text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, trainers

from runtime.data.arith import Problem
from runtime.data.tokenizer import EOS, PAD, Tokenizer, TokenizerError

SPECIAL_TOKENS = (PAD, EOS)

# Settings under which the pitfall's cut appears exactly (digits glued to operators, the end marker swallowed):
#   37+48=85<eos> -> "3" | "7+4" | "8=8" | "5<eos>\n"
# ArithSettings(seed=8, num_examples=10_000, width_balance=0) (other fields default: 0-99, "+", 10% held-out pairs)
# and BpeSettings(num_merges=300, glue_end_marker=True). Other seeds give similar fragments (seeds 0-7 with the
# one-digit table always trained: "3" | "7+4" | "8" | "=85<eos>\n"; seed 4 gave the exact cut before), and so does
# the default data (one- and two-digit operands drawn more evenly); width_balance=0 keeps the report's own data, both
# operands uniform over 0-99.
REPORT_ARITH_SEED = 8
REPORT_NUM_EXAMPLES = 10_000
REPORT_WIDTH_BALANCE = 0.0
REPORT_NUM_MERGES = 300


@dataclass
class BpeSettings:
    num_merges: int = 300
    glue_end_marker: bool = True  # the pitfall: "<eos>\n" written as text, which merges can swallow
    newline: bool = True  # end each training line with "\n" (only with glue_end_marker)

    def __post_init__(self) -> None:
        if self.num_merges < 0:
            raise TokenizerError(f"num_merges must be >= 0, got {self.num_merges}")

    @property
    def end_text(self) -> str:
        """What follows each answer in the data: the marker (and newline) the tokenizer is trained on."""
        return EOS + ("\n" if self.newline else "") if self.glue_end_marker else EOS

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BpeSettings:
        return cls(**json.loads(text))


def training_lines(problems: list[Problem], settings: BpeSettings) -> list[str]:
    """The text the BPE learns from: one sequence per problem."""
    if settings.glue_end_marker:
        return [p.text(settings.end_text) for p in problems]
    return [p.prompt + p.answer for p in problems]


def train_bpe(lines: list[str], settings: BpeSettings) -> HFTokenizer:
    """A Hugging Face BPE (no normalizer, no pre-tokenizer) with ``settings.num_merges`` merges."""
    alphabet = sorted(set("".join(lines)))
    tokenizer = HFTokenizer(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=len(SPECIAL_TOKENS) + len(alphabet) + settings.num_merges,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        min_frequency=0,
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    tokenizer.encode_special_tokens = settings.glue_end_marker
    return tokenizer


def _hf_merges(tokenizer: HFTokenizer) -> list[tuple[str, str]]:
    model = json.loads(tokenizer.to_str())["model"]
    merges = []
    for merge in model["merges"]:
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge  # older versions write "a b"
        merges.append((a, b))
    return merges


def to_runtime(tokenizer: HFTokenizer, settings: BpeSettings) -> Tokenizer:
    """The same vocabulary (same ids) and merges as a pure-Python runtime ``Tokenizer``."""
    vocab_by_id = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    if [i for _, i in vocab_by_id] != list(range(len(vocab_by_id))):
        raise TokenizerError("the Hugging Face vocabulary ids are not contiguous")
    return Tokenizer(
        vocab=[token for token, _ in vocab_by_id],
        merges=_hf_merges(tokenizer),
        special_tokens=SPECIAL_TOKENS,
        split_special_tokens=not settings.glue_end_marker,
        end_text=settings.end_text,
    )


def train_arith_bpe(problems: list[Problem], settings: BpeSettings) -> tuple[HFTokenizer, Tokenizer]:
    """Train on the problems' text; return the Hugging Face tokenizer and its runtime export."""
    hf = train_bpe(training_lines(problems, settings), settings)
    return hf, to_runtime(hf, settings)


def train_for_task(texts: Sequence[Problem | str], num_merges: int, *, glue_end_marker: bool = True) -> Tokenizer:
    """The ``HostServices.train_bpe`` hook: a runtime ``Tokenizer`` with ``num_merges`` BPE merges.

    ``texts``: arithmetic problems (written as ``training_lines`` does: with the end marker glued into the text
    when ``glue_end_marker``, the pitfall's setting) or ready-made training lines, used as they are.
    """
    settings = BpeSettings(num_merges=num_merges, glue_end_marker=glue_end_marker)
    lines = [t if isinstance(t, str) else t.text(settings.end_text) if glue_end_marker else t.prompt + t.answer
             for t in texts]
    return to_runtime(train_bpe(lines, settings), settings)
