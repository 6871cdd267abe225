"""``peertrain bench comm``: registered, its options shown; its message sizes are real messages of each codec."""

from __future__ import annotations

import re

import pytest

from runtime import wire
from runtime.codec import Codec
from server.bench import run_bench, summary
from server.bench.comm import message_bytes
from server.session.package import Package


def test_comm_is_a_registered_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert re.search(r"^\s+comm\s+built$", summary(), flags=re.M), summary()
    with pytest.raises(SystemExit) as exited:
        run_bench("comm", ["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert all(option in shown for option in ("--codecs", "--seeds", "--tasks", "--topk-fraction", "--quick"))


def test_message_sizes_are_those_of_real_messages(package: Package) -> None:
    size = package.task.spec().size
    none, down = message_bytes(package, Codec())
    int8, _ = message_bytes(package, Codec("int8"))
    topk, _ = message_bytes(package, Codec("topk", 0.25))
    weights = wire.encode(package.initial_weights, wire.WireHeader(spec=package.task.spec(), round=0,
                                                                   fingerprint=package.fingerprint, num_examples=0))
    assert down == len(weights) and none > 4 * size
    assert none - int8 >= 3 * size - 100  # one byte an entry in place of four, less the scales and the codec's header
    payloads = Codec("int8").payload_bytes(size) - Codec("topk", 0.25).payload_bytes(size)
    assert payloads - 40 <= int8 - topk <= payloads  # (topk's header also names its fraction)
