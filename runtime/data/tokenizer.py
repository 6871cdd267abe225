"""A pure-Python tokenizer that runs everywhere (host and Pyodide): characters, or characters plus BPE merges.

``Tokenizer`` holds a vocabulary (token strings, index = id), optional BPE merges (pairs, in rank order)
and special tokens. Encoding first cuts the special-token strings out of the text (unless
``split_special_tokens`` is False, see below), then runs byte-pair merging on each remaining piece with no
pre-tokenization: start from single characters and repeatedly merge the adjacent pair whose merge has the
lowest rank, leftmost first. That is what Hugging Face ``tokenizers``' ``models.BPE`` does for a tokenizer
without normalizer or pre-tokenizer, so a BPE trained by ``server.session.bpe`` encodes to the same ids here.

``split_special_tokens=False`` mirrors Hugging Face's ``encode_special_tokens = True``: ``<eos>`` stays a
real special token in the vocabulary, but the string ``"<eos>"`` written in the text is merged like any
other characters. That is how a BPE trained on arithmetic glues the end marker to the last digit
(``"5<EOS>\\n"``: one token for a digit and the end of the answer); a ``CharTokenizer`` keeps every
character and special token apart, which avoids it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PAD = "<pad>"
EOS = "<eos>"
DIGITS = "0123456789"
OPERATOR_CHARS = "+-*/="  # operators and the equals sign: no token should glue them to a digit


class TokenizerError(ValueError):
    """The tokenizer cannot represent some text or id, or its definition is inconsistent."""


@dataclass
class Tokenizer:
    vocab: list[str]
    merges: list[tuple[str, str]] = field(default_factory=list)
    special_tokens: tuple[str, ...] = (PAD, EOS)
    split_special_tokens: bool = True
    end_text: str = EOS  # what the data format writes after an answer (may include a newline)

    def __post_init__(self) -> None:
        self.vocab = list(self.vocab)
        self.merges = [(str(a), str(b)) for a, b in self.merges]
        self.special_tokens = tuple(self.special_tokens)
        self._ids = {token: i for i, token in enumerate(self.vocab)}
        if len(self._ids) != len(self.vocab):
            raise TokenizerError("the vocabulary has duplicate tokens")
        for token in self.special_tokens:
            if token not in self._ids:
                raise TokenizerError(f"special token {token!r} is not in the vocabulary")
        self._ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        for a, b in self.merges:
            if a + b not in self._ids:
                raise TokenizerError(f"merge {a!r} + {b!r} makes {a + b!r}, which is not in the vocabulary")

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_id(self, token: str) -> int:
        if token not in self._ids:
            raise TokenizerError(f"token {token!r} is not in the vocabulary")
        return self._ids[token]

    @property
    def pad_id(self) -> int:
        return self.token_id(PAD)

    @property
    def eos_id(self) -> int:
        return self.token_id(EOS)

    def _segments(self, text: str) -> list[tuple[str, bool]]:
        """Cut ``text`` into (piece, is_special); the longest special token wins at each position."""
        if not self.split_special_tokens or not self.special_tokens:
            return [(text, False)] if text else []
        specials = sorted(self.special_tokens, key=len, reverse=True)
        segments: list[tuple[str, bool]] = []
        start = i = 0
        while i < len(text):
            match = next((s for s in specials if text.startswith(s, i)), None)
            if match is None:
                i += 1
                continue
            if i > start:
                segments.append((text[start:i], False))
            segments.append((match, True))
            i = start = i + len(match)
        if start < len(text):
            segments.append((text[start:], False))
        return segments

    def _merge(self, word: str) -> list[str]:
        parts = list(word)
        for ch in parts:
            if ch not in self._ids:
                raise TokenizerError(f"character {ch!r} is not in the vocabulary (in {word!r})")
        while len(parts) > 1 and self._ranks:
            ranks = [self._ranks.get((parts[i], parts[i + 1])) for i in range(len(parts) - 1)]
            known = [r for r in ranks if r is not None]
            if not known:
                break
            best = self.merges[min(known)]
            merged: list[str] = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def pieces(self, text: str) -> list[str]:
        """The token strings ``text`` is cut into; they concatenate back to ``text``."""
        out: list[str] = []
        for segment, special in self._segments(text):
            out.extend([segment] if special else self._merge(segment))
        return out

    def encode(self, text: str) -> list[int]:
        return [self._ids[piece] for piece in self.pieces(text)]

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.vocab):
                raise TokenizerError(f"token id {i} is outside the vocabulary (size {len(self.vocab)})")
            out.append(self.vocab[i])
        return "".join(out)

    def to_json(self) -> str:
        return json.dumps(
            {
                "vocab": self.vocab,
                "merges": [list(pair) for pair in self.merges],
                "special_tokens": list(self.special_tokens),
                "split_special_tokens": self.split_special_tokens,
                "end_text": self.end_text,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        data = json.loads(text)
        return cls(
            vocab=data["vocab"],
            merges=[(a, b) for a, b in data["merges"]],
            special_tokens=tuple(data["special_tokens"]),
            split_special_tokens=bool(data["split_special_tokens"]),
            end_text=data["end_text"],
        )


class CharTokenizer(Tokenizer):
    """No merges: every character is its own token, plus real ``<pad>`` and ``<eos>`` tokens (ids 0 and 1)."""

    @classmethod
    def build(cls, alphabet: Iterable[str], *, end_text: str = EOS) -> CharTokenizer:
        chars = list(dict.fromkeys("".join(alphabet)))
        for ch in chars:
            if ch in (PAD, EOS):
                raise TokenizerError(f"{ch!r} is a special token, not a character")
        return cls(vocab=[PAD, EOS, *chars], end_text=end_text)


def _show(piece: str) -> str:
    return '"' + piece.replace("\\", "\\\\").replace("\n", "\\n") + '"'


def inspect_tokenization(tokenizer: Tokenizer, examples: Sequence[str]) -> list[str]:
    """One line per example: ``37+48=85<eos> -> "3" | "7+4" | "8=8" | "5<eos>\\n"`` (newlines shown as \\n)."""
    return [f"{text.rstrip(chr(10))} -> " + " | ".join(_show(p) for p in tokenizer.pieces(text)) for text in examples]


def glued_tokens(tokenizer: Tokenizer) -> list[str]:
    """Tokens that hold a digit together with an operator or '=' (a char tokenizer has none)."""
    return [
        token
        for token in tokenizer.vocab
        if token not in tokenizer.special_tokens
        and any(c in DIGITS for c in token)
        and any(c in OPERATOR_CHARS for c in token)
    ]


def tokenization_warning(tokenizer: Tokenizer, *, show: int = 8) -> str | None:
    """A human-readable warning when tokens glue digits to operators or the end marker; None when clean."""
    problems = []
    glued = glued_tokens(tokenizer)
    if glued:
        sample = ", ".join(_show(t) for t in glued[:show])
        problems.append(f"{len(glued)} tokens glue digits to operators or '=' (e.g. {sample})")
    eos_glued = [t for t in tokenizer.vocab if EOS in t and t != EOS]
    if eos_glued or not tokenizer.split_special_tokens:
        sample = ", ".join(_show(t) for t in eos_glued[:show])
        problems.append(f"the end marker {EOS} is merged with other characters ({sample or 'as text'})")
    if not problems:
        return None
    return (
        "tokenizer warning: " + "; ".join(problems) + ". The model will see fragments instead of digits; "
        "use a character vocabulary (CharTokenizer) with a real <eos> token."
    )
