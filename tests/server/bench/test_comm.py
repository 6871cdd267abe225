"""``peertrain bench comm``: registered, its options shown; its message sizes are real messages of each codec; the
network half's shaped link carries bytes unchanged and no faster than its rates."""

from __future__ import annotations

import re

import pytest

from runtime import wire
from runtime.codec import Codec
from server.bench import run_bench, summary
from server.bench.comm import download_bytes, upload_bytes
from server.harness.link import LinkSpec, ShapedLink
from server.session.config import SessionConfig
from server.session.package import Package
from server.simulation.sweep_worker import train_session


def test_comm_is_a_registered_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert re.search(r"^\s+comm\s+built$", summary(), flags=re.M), summary()
    with pytest.raises(SystemExit) as exited:
        run_bench("comm", ["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert all(option in shown for option in ("--codecs", "--seeds", "--tasks", "--topk-fraction", "--quick",
                                              "--network", "--link", "--network-codecs", "--network-peers",
                                              "--network-chunks", "--network-timeout"))


def test_message_sizes_are_those_of_real_messages(package: Package) -> None:
    size = package.task.spec().size
    none, int8, topk = (upload_bytes(package, codec) for codec in (Codec(), Codec("int8"), Codec("topk", 0.25)))
    weights = wire.encode(package.initial_weights, wire.WireHeader(spec=package.task.spec(), round=0,
                                                                   fingerprint=package.fingerprint, num_examples=0))
    assert none > 4 * size
    assert none - int8 >= 3 * size - 100  # one byte an entry in place of four, less the scales and the codec's header
    payloads = Codec("int8").payload_bytes(size) - Codec("topk", 0.25).payload_bytes(size)
    assert payloads - 40 <= int8 - topk <= payloads  # (topk's header also names its fraction)
    # Downloads: the full weights without a codec; with int8 the chain of the session's last step, which names
    # two digests per link and so only pays for itself past a few hundred weights (this model has 354).
    plain = train_session(package, SessionConfig(participants=2, passes=1), None)
    assert download_bytes(plain, package) == len(weights)
    stepped = train_session(package, SessionConfig(participants=2, passes=1, codec="int8"), None)
    step = stepped.downloads.log.steps[-1]
    assert len(step.payload) == Codec("int8").payload_bytes(size)
    assert len(step.payload) < download_bytes(stepped, package) < len(weights)


def test_a_shaped_link_carries_every_byte_in_order_and_no_faster_than_its_rates() -> None:
    """A local echo server behind a 2/4 Mbit/s link with 30 ms one way: bytes come back unchanged, each pipe counts
    them, and a 100 kB round trip takes at least its serialization times plus two delays (a lower bound: a busy
    machine only makes it slower)."""
    import socketserver
    import threading
    import time

    class Echo(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            while data := self.request.recv(65536):
                self.request.sendall(data)

    # (a plain threaded server: no event loop in this thread, where an earlier test may have left one running)
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    link = ShapedLink(("127.0.0.1", server.server_address[1]), LinkSpec.parse("2/4/30")).start()
    try:
        import socket

        payload = bytes(range(256)) * 400  # 102,400 bytes
        host, port = link.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            started = time.monotonic()
            connection.sendall(payload)
            received = b""
            while len(received) < len(payload):
                chunk = connection.recv(65536)
                assert chunk, "the link closed early"
                received += chunk
            took = time.monotonic() - started
        assert received == payload
        assert (link.up.bytes, link.down.bytes) == (len(payload), len(payload))
        assert took >= len(payload) * 8 / 4e6 + 0.06  # at least the slower pipe's time and both delays
    finally:
        link.close()
        server.shutdown()
        server.server_close()
        thread.join(10)
    with pytest.raises(ValueError, match="UP/DOWN/DELAY"):
        LinkSpec.parse("10/50")
    with pytest.raises(ValueError, match="only forwards to this machine"):
        ShapedLink(("192.0.2.1", 80), LinkSpec(1, 1, 0))
