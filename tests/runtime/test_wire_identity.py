"""Result messages compared by their bytes (``runtime.wire``): ``same_weights`` on two messages, and the
``weights_identity`` that ``result_parts`` takes of one as it is read (the relay compares a copy with its first result
by it), against decoding as the oracle."""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime import codecs, wire
from runtime.weights import WeightSpec
from runtime.wire import WireHeader, encode

SPEC = WeightSpec((("w", (2, 2)), ("b", (2,))))  # 6 values
VECTOR = np.array([1.0, -2.0, 0.5, 3.25, 0.0, 100.0], dtype=np.float32)


def make_header(**changes: Any) -> WireHeader:
    fields: dict[str, Any] = dict(spec=SPEC, round=3, fingerprint="abc123", num_examples=128, metrics={"loss": 2.5},
                                  meta={"peer": "p1"})
    fields.update(changes)
    return WireHeader(**fields)


def test_same_weights_compares_the_bytes_that_decode_to_weights_and_nothing_else() -> None:
    """Two results of one unit agree by their payload, codec, base and spec; their own fields (the peer, metrics,
    timing) may differ. Every other difference says "compare them decoded", and that decode is the oracle here."""
    codec = codecs.from_json({"name": "int8"})
    base = np.zeros(6, dtype=np.float32)
    update = codec.encode(VECTOR / 100, seed=1)

    def message(payload: bytes = update, digest: str = wire.weights_digest(base), **changes: Any) -> bytes:
        return wire.encode_update(payload, make_header(**changes), codec, digest)

    first = message()
    decoded = wire.result_weights(first, base, codec=codec)[1]
    alike = message(metrics={"loss": 9.0}, meta={"peer": "p2", "engine_class": "x"}, num_examples=1)
    assert wire.same_weights(first, alike) and np.array_equal(wire.result_weights(alike, base, codec=codec)[1], decoded)
    other = message(codec.encode(-VECTOR / 100, seed=1))
    assert not wire.same_weights(first, other)
    assert not np.array_equal(wire.result_weights(other, base, codec=codec)[1], decoded)
    assert not wire.same_weights(first, message(digest="0" * 16))  # (against other weights)
    assert not wire.same_weights(first, message(spec=WeightSpec((("w", (6,)),))))
    assert not wire.same_weights(first, encode(decoded, make_header()))  # (a weights message: decode both)
    assert wire.same_weights(encode(VECTOR, make_header()), encode(VECTOR, make_header(round=4)))
    assert not wire.same_weights(encode(VECTOR, make_header()), encode(-VECTOR, make_header()))


def test_a_results_identity_is_the_same_for_the_same_weights_bytes_and_its_parts_are_what_decoding_gives() -> None:
    """``result_parts`` reads a result once: its weights and header as ``result_weights`` gives them, the update an
    update message carries as ``carried_update`` decodes it, and a ``weights_identity`` that two messages share
    exactly where ``same_weights`` says they are the same weights (the byte comparison is the oracle)."""
    codec = codecs.from_json({"name": "int8"})
    base = np.linspace(-1, 1, 6).astype(np.float32)
    update = codec.encode(VECTOR / 100, seed=1)

    def message(payload: bytes = update, digest: str = wire.weights_digest(base), **changes: Any) -> bytes:
        return wire.encode_update(payload, make_header(**changes), codec, digest)

    first = message()
    parts = wire.result_parts(first, base, codec=codec)
    header, weights = wire.result_weights(first, base, codec=codec)
    assert parts.header == header and np.array_equal(parts.weights, weights)
    assert parts.update is not None and np.array_equal(parts.update, wire.carried_update(first, codec))
    assert len(parts.identity) == 64 and wire.result_parts(first, base, codec=codec, identity=False).identity == ""
    alike = message(metrics={"loss": 9.0}, meta={"peer": "p2", "engine_class": "x"}, num_examples=1, round=2)
    others = [message(codec.encode(-VECTOR / 100, seed=1)), message(spec=WeightSpec((("w", (6,)),)))]
    for other in [alike, *others]:
        same = wire.same_weights(first, other)
        assert (wire.result_parts(other, base, codec=codec).identity == parts.identity) == same, other
    assert wire.same_weights(first, alike)  # (the oracle says so for one of them, and not for the others)
    none = codecs.from_json({"name": "none"})
    weights_message = encode(weights, make_header())
    kept = wire.result_parts(weights_message, base, codec=none)
    assert kept.update is None and np.array_equal(kept.weights, weights) and kept.identity != parts.identity
    assert kept.identity == wire.result_parts(encode(weights, make_header(round=4)), base, codec=none).identity
    assert kept.identity != wire.result_parts(encode(-weights, make_header()), base, codec=none).identity
