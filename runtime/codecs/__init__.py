"""Update codecs, one file each, chosen by name: how a peer's change to the weights travels, smaller than float32.

``none`` (``none.py``): the float32 weights themselves. ``int8`` (``int8.py``): an int8 per entry and a scale per
block, stochastically rounded. ``topk`` (``topk.py``): the largest fraction of each block, with error feedback
(``feedback.py``). ``base.py`` declares what a codec is (``Codec``: its properties, ``encode``/``decode``, JSON) and
the block maths; ``registry.py`` finds a codec by name: ``from_json({"name": "int8", "block": 256})``,
``lookup("int8")``, ``names()``. Importing this package registers the built-in codecs.
"""

from __future__ import annotations

# Each codec's file registers it on import; names() lists them in this order: none, int8, topk.
from runtime.codecs.none import NoneCodec  # isort: split

from runtime.codecs.base import BLOCK, Codec, CodecError
from runtime.codecs.feedback import ErrorFeedback, arrived
from runtime.codecs.int8 import Int8Codec
from runtime.codecs.registry import from_json, lookup, names, register
from runtime.codecs.topk import DEFAULT_TOPK_FRACTION, TopKCodec

__all__ = [
    "BLOCK",
    "DEFAULT_TOPK_FRACTION",
    "Codec",
    "CodecError",
    "ErrorFeedback",
    "Int8Codec",
    "NoneCodec",
    "TopKCodec",
    "arrived",
    "from_json",
    "lookup",
    "names",
    "register",
]
