"""The update codecs under their names from before codecs were plug-ins, for callers (and tools outside the project)
written against this module: ``Codec(name, fraction, block)``, ``Codec.from_json(...)``, ``CODECS``, ``ErrorFeedback``.

The codecs themselves live in ``runtime.codecs``, one file each, found through its registry; new code imports from
there and annotates with ``runtime.codecs.Codec``.
"""

from __future__ import annotations

from runtime.codecs import (
    BLOCK,
    DEFAULT_TOPK_FRACTION,
    CodecError,
    ErrorFeedback,
    Int8Codec,
    NoneCodec,
    TopKCodec,
    arrived,
    from_json,
)
from runtime.codecs import Codec as AnyCodec
from runtime.codecs.base import SCALE_DTYPE

CODECS = tuple(codec.name for codec in (NoneCodec, Int8Codec, TopKCodec))  # the built-ins; runtime.codecs.names():
# every registered codec


class Codec:
    """``Codec(name, fraction, block)``: the codec registered as ``name`` with these settings (``fraction`` is
    topk's share of each block; a codec without one ignores it), an instance of ``runtime.codecs.Codec``."""

    def __new__(cls, name: str = "none", fraction: float = DEFAULT_TOPK_FRACTION,  # type: ignore[misc]
                block: int = BLOCK) -> AnyCodec:
        return from_json({"name": name, "block": block, "fraction": fraction})

    from_json = staticmethod(from_json)


__all__ = ["BLOCK", "CODECS", "DEFAULT_TOPK_FRACTION", "SCALE_DTYPE", "Codec", "CodecError", "ErrorFeedback",
           "arrived"]
