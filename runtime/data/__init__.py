"""Data for the built-in tasks: arithmetic problems, byte-level text, tokenizers."""

from __future__ import annotations
