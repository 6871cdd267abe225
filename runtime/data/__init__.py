"""Data for the built-in tasks: arithmetic problems, byte-level text, tokenizers (numpy + stdlib only)."""

from __future__ import annotations

from runtime.data.arith import (
    IGNORE_INDEX,
    ArithError,
    ArithSettings,
    Problem,
    char_tokenizer,
    generalization_problems,
    generate_problems,
    make_lm_examples,
    parse_answer,
    split_pairs,
    validation_problems,
)
from runtime.data.text import byte_chunks, default_corpus, lm_windows, validation_windows
from runtime.data.tokenizer import CharTokenizer, Tokenizer, TokenizerError, glued_tokens, inspect_tokenization

__all__ = [
    "IGNORE_INDEX",
    "ArithError",
    "ArithSettings",
    "char_tokenizer",
    "CharTokenizer",
    "Problem",
    "Tokenizer",
    "TokenizerError",
    "byte_chunks",
    "default_corpus",
    "generalization_problems",
    "generate_problems",
    "glued_tokens",
    "inspect_tokenization",
    "lm_windows",
    "make_lm_examples",
    "parse_answer",
    "split_pairs",
    "validation_problems",
    "validation_windows",
]
