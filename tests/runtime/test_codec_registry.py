"""Codecs as plug-ins (``runtime.codecs``): the registry finds a codec by name, each codec says what it is as
properties (no caller asks for its name), the JSON and the old ``runtime.codec`` names are what they were, and a toy
codec registered from one file (``toy_codec.py``: float16) runs whole sessions, in the simulator and through the
relay's HTTP API with native peers, host replays and downloads as chains of steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from starlette.testclient import TestClient
from toy_codec import Float16Codec

from runtime import codecs, deltas, wire
from runtime.codecs import Codec, CodecError, Int8Codec, NoneCodec, TopKCodec
from runtime.peer import Peer
from server.relay.app import RelayPaths, create_app
from server.relay.client import RelayClient, named_weights_call, result_call, work_call
from server.relay.options import RelayOptions
from server.relay.state import Relay
from server.relay.store import open_store
from server.session.config import SessionConfig
from server.session.package import Package
from server.session.rules import resolve
from server.session.session import Session
from server.session.settings import SessionError, SettingError
from server.simulation.sweep_worker import train_session


def test_the_built_in_codecs_are_registered_in_order_and_say_what_they_are() -> None:
    assert codecs.names()[:3] == ("none", "int8", "topk")
    table = {name: (c.compresses, c.reproducible, c.needs_error_feedback, c.comparable)
             for name in ("none", "int8", "topk") for c in [codecs.from_json({"name": name})]}
    assert table == {"none": (False, True, False, True), "int8": (True, True, False, True),
                     "topk": (True, True, True, False)}
    assert TopKCodec().compared_fallback == "int8" and codecs.lookup("int8") is Int8Codec
    assert [NoneCodec().payload_bytes(300), Int8Codec().payload_bytes(300), TopKCodec(fraction=0.1).payload_bytes(300)
            ] == [1200, 2 * 4 + 300, 2 * 4 + 2 * (26 + 5)]


def test_the_json_and_the_old_names_are_unchanged() -> None:
    from runtime.codec import CODECS
    from runtime.codec import Codec as OldCodec

    assert Int8Codec().to_json() == {"name": "int8", "block": 256} and NoneCodec().to_json()["name"] == "none"
    assert list(TopKCodec(fraction=0.25, block=8).to_json().items()) == [("name", "topk"), ("block", 8),
                                                                         ("fraction", 0.25)]
    assert OldCodec("topk", 0.25, 8) == TopKCodec(fraction=0.25, block=8) == codecs.from_json(
        {"name": "topk", "block": 8, "fraction": 0.25})
    assert OldCodec() == NoneCodec() and OldCodec("int8", block=4) == Int8Codec(block=4)
    assert OldCodec.from_json({"name": "int8"}) == Int8Codec() and CODECS == ("none", "int8", "topk")
    assert isinstance(OldCodec("int8"), Codec)


def test_an_unknown_name_or_setting_is_a_bad_codec_naming_the_choices() -> None:
    with pytest.raises(CodecError, match="choose one of none, int8, topk") as unknown:
        codecs.lookup("zip")
    assert unknown.value.code == "bad_codec"
    for bad in ({"name": "zip"}, {"name": "topk", "fraction": "a tenth"}, {"name": "int8", "block": True},
                {"name": "int8", "block": 0}, "int8", {"block": 8}):
        with pytest.raises(CodecError) as refused:
            codecs.from_json(bad)
        assert refused.value.code == "bad_codec", bad


def test_register_takes_a_class_once_and_refuses_a_second_under_a_taken_name() -> None:
    assert codecs.register(Float16Codec) is Float16Codec  # (already registered on import: nothing changes)

    class Impostor(Int8Codec):
        name: ClassVar[str] = "int8"

    class Nameless(Int8Codec):
        name: ClassVar[str] = ""

    with pytest.raises(ValueError, match="registered already"):
        codecs.register(Impostor)
    with pytest.raises(ValueError, match="declares its name"):
        codecs.register(Nameless)
    assert codecs.lookup("int8") is Int8Codec


def test_the_toy_codec_is_found_by_name_and_round_trips() -> None:
    codec = codecs.from_json({"name": "float16", "block": 256})
    assert codec == Float16Codec() and "float16" in codecs.names() and codec.to_json() == {"name": "float16",
                                                                                         "block": 256}
    assert codec.compresses and codec.comparable and not codec.needs_error_feedback
    update = np.array([0.5, -1e-3, 3.0, 0.0, 1234.5], dtype=np.float32)
    payload = codec.encode(update, seed=1)
    assert payload == codec.encode(update, seed=2) and len(payload) == codec.payload_bytes(5) == 10
    assert np.array_equal(codec.decode(payload, 5), update.astype(np.float16).astype(np.float32))
    with pytest.raises(CodecError) as too_large:
        codec.encode(np.array([1e6], np.float32), 0)
    assert too_large.value.code == "non_finite"
    with pytest.raises(CodecError) as short:
        codec.decode(payload[:-2], 5)
    assert short.value.code == "length_mismatch"


def test_the_session_settings_offer_every_registered_codec(package: Package) -> None:
    assert SessionConfig(codec="float16").result_codec == Float16Codec()
    with pytest.raises(SettingError, match="float16"):  # (the refusal lists what is registered)
        SessionConfig(codec="float17")
    options = RelayOptions(admin_token="t", verify=True)
    kept = resolve(SessionConfig(codec="float16"), options, package, force_verify=True)
    assert kept.config.codec == "float16" and kept.options.verify  # reproducible: replays compare its bytes
    with pytest.raises(SessionError, match="--codec topk sends what earlier units dropped"):
        resolve(SessionConfig(codec="topk"), options, package, force_verify=True)
    auto = SessionConfig()
    assert auto.with_codec_for("float16", compares=True).codec == "float16"
    assert auto.with_codec_for("topk", compares=True).codec == "int8"
    assert auto.with_codec_for("topk", compares=False).codec == "topk"


def test_a_simulated_session_trains_with_the_toy_codec_and_its_steps_rebuild_the_weights(package: Package) -> None:
    config = SessionConfig(participants=2, passes=2, codec="float16")
    held = [package.initial_weights]  # the weights each round ends at
    session = train_session(package, config, None, on_round=lambda session, _: held.append(session.weights.copy()))
    plain = train_session(package, dataclasses.replace(config, codec="none"), None)
    losses = [entry["metrics"]["val_loss"] for entry in session.history]
    assert len(losses) == 4 and all(entry["download"]["codec"] == "float16" for entry in session.history)
    assert all(entry["download"]["bytes"] == 2 * package.spec.size for entry in session.history)
    assert losses[-1] < losses[0] and losses[-1] == pytest.approx(plain.history[-1]["metrics"]["val_loss"], rel=0.02)
    assert not np.array_equal(session.weights, plain.weights)  # the codec mattered, and only by float16's rounding
    assert np.allclose(session.weights, plain.weights, rtol=0.02, atol=1e-3)
    steps = session.downloads.log.steps  # (as many as fit in one float32 vector's bytes: two float16 steps)
    chain = deltas.encode_chain(steps, spec=session.spec, fingerprint=package.fingerprint,
                                codec=session.downloads.codec, round_index=session.round)
    round_index, rebuilt = deltas.apply_chain(chain, held[-1 - len(steps)], spec=session.spec,
                                              fingerprint=package.fingerprint)
    assert len(steps) == 2 and round_index == 4 and rebuilt.tobytes() == session.weights.tobytes()


def test_a_relay_session_with_the_toy_codec_replays_its_results_and_ends_on_the_simulators_weights(
        package: Package, tmp_path: Path) -> None:
    """Native peers take float16 jobs, upload float16 updates, get later weights as chains of float16 steps; the
    host replays every result and finds the same bytes."""
    config = SessionConfig(participants=2, passes=2, codec="float16")
    relay = Relay(session=Session.create(package, config, directory=tmp_path / "session"), package=package,
                  store=open_store(tmp_path / "relay.sqlite3"),
                  options=RelayOptions(admin_token="admin", verify=True, verify_fraction=1.0, replay_engine="native",
                                       backup_after=None, keep_results=None))
    chains = 0
    try:
        with TestClient(create_app(RelayPaths(), relay)) as client:
            peers = [RelayClient(client) for _ in range(2)]
            for peer in peers:
                peer.join()
            trainers = [Peer(peers[0].task()) for _ in peers]
            for _ in range(40):
                if peers[0].status()["done"]:
                    break
                for peer, trainer in zip(peers, trainers, strict=True):
                    job = peer.call(work_call(hold=10))  # (the JSON a peer reads: an assignment, a wait or the end)
                    if "slot" not in job:
                        continue
                    assert job["codec"] == {"name": "float16", "block": 256}
                    if trainer.weights is None:
                        trainer.set_weights(peer.weights())
                    elif trainer.weights_sha != job["weights_digest"]:
                        message = peer.call(named_weights_call(job["weights_digest"], trainer.weights_sha))
                        chains += deltas.is_chain(message)
                        trainer.set_weights(message)
                    body = trainer.train(job, peer.unit(int(job["unit_index"])))
                    assert wire.is_update(body) and len(body) < 2 * package.spec.size + 1000
                    assert peer.send(result_call(job["round"], job["slot"], body)).status_code == 200
            status = peers[0].status()
    finally:
        relay.store.close()
    counters = status["counters"]
    assert status["done"] and counters["results_accepted"] == 8, status
    assert not any(name.startswith("refused.") for name in counters), counters
    assert counters["results_verified"] == 8 and "verification_failed" not in counters, counters
    assert chains >= 1  # a peer holding the weights before a merge took the float16 step, not the whole vector
    expected = train_session(package, config, None).weights
    assert relay.session.weights.tobytes() == expected.tobytes()
