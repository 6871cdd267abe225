"""Engines the host cannot replay, checked by copies within their engine class (BOINC's homogeneous redundancy).

bytetext's units part ways across engines, so a session that replays on the browser's engine cannot judge a native
peer's result. With ``--redundancy`` such a result is taken when another connected peer says it trains on the same
engine class (``runtime.peer.engine_class``: the engine, numpy's version, its BLAS and the SIMD its kernels use), and a
copy from a peer of that class checks it bit for bit where a replay would have (adaptive replication picks which); a
dispute between two of them goes to a third of the class (the quorum), never to the host's replay of another engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from relay_fixtures import HttpPeer, build_text_package, flipped, make_relay, serving, session_status, work_until_done

from runtime import wire
from runtime.peer import engine_build, engine_class
from server.browser_assets import engines
from server.relay.state import Relay
from server.session.package import Package

pytestmark = pytest.mark.skipif(engines.pyodide_missing() is not None,
                                reason=f"the browser's engine cannot run here: {engines.pyodide_missing()}")
NATIVE = engine_class()


@pytest.fixture(scope="module")
def text_package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    return build_text_package(tmp_path_factory.mktemp("text"), chunks=4)


def classed_relay(package: Package, tmp_path: Path, **options: Any) -> Relay:
    """A bytetext session that replays on the browser's engine (so native results are not the host's to judge),
    every result checked (``verify_fraction`` 1) and copies on."""
    return make_relay(package, tmp_path / "session", k=2, passes=1, config={"codec": "int8"}, verify=True,
                      verify_fraction=1.0, replay_engine="pyodide", **({"redundancy": 0.5} | options))


def test_the_engine_class_names_the_engine_and_the_numpy_build_and_results_carry_it(text_package: Package,
                                                                                      tmp_path: Path) -> None:
    assert engine_build().startswith(f"numpy-{np.__version__}") and NATIVE.startswith("native-numpy "), NATIVE
    relay = classed_relay(text_package, tmp_path)
    with serving(relay) as client:
        peer = HttpPeer(client, engine_class=NATIVE)
        body = peer.train(peer.assignment())
    assert wire.read_header(body).meta["engine_class"] == NATIVE


def test_native_peers_of_one_class_check_each_other_by_copies_and_the_host_replays_nothing(
        text_package: Package, tmp_path: Path) -> None:
    relay = classed_relay(text_package, tmp_path)
    with serving(relay) as client:
        work_until_done(client, [HttpPeer(client, engine_class=NATIVE) for _ in range(3)], hold=5)
        status = session_status(client)
        rows = [row["verification"] or "" for row in relay.store.audit()]
    counters = status["counters"]
    assert status["done"] and status["round"] == 2, status
    assert "refused.engine_not_replayable" not in counters and "peers_banned" not in counters, counters
    assert "replays_queued" not in counters and "replays_started_at_hand_out" not in counters, counters
    # every merged result (4 units) was checked by an identical copy from another native peer
    assert counters["copies_for_engine_class"] == 4 and counters["copies_identical"] == 4, counters
    assert sum(row.startswith("copy identical") for row in rows) == 4, rows


def test_a_peer_alone_in_its_engine_class_is_refused_and_told_why(text_package: Package, tmp_path: Path) -> None:
    relay = classed_relay(text_package, tmp_path)
    with serving(relay) as client:
        alone = HttpPeer(client, engine_class=NATIVE)
        HttpPeer(client, engine_class="native-numpy 000000000000")  # (another class: another numpy build)
        answer = alone.train_and_upload()
        assert answer.status_code == 422 and answer.json()["error"] == "engine_not_replayable", answer.json()
        assert "another connected peer of its engine class" in answer.json()["message"], answer.json()
        assert session_status(client)["round_progress"]["done"] == 0
    without = classed_relay(text_package, tmp_path / "without", redundancy=0.0)
    with serving(without) as client:
        pair = [HttpPeer(client, engine_class=NATIVE) for _ in range(2)]
        answer = pair[0].train_and_upload()
        assert answer.status_code == 422 and "--redundancy" in answer.json()["message"], answer.json()


def test_a_liar_in_the_class_is_outvoted_by_two_honest_copies_and_banned(text_package: Package,
                                                                         tmp_path: Path) -> None:
    """The liar says it trains on the honest peers' class (to be handed their copies) and flips every update. Its
    result and an honest copy disagree; the host cannot replay either, so a third peer of the class trains the unit
    and the two that agree ban the other."""
    relay = classed_relay(text_package, tmp_path)
    with serving(relay) as client:
        honest = [HttpPeer(client, engine_class=NATIVE) for _ in range(3)]
        liar = HttpPeer(client, engine_class=NATIVE)
        peers = [liar, *honest]
        for turn in range(200):
            if session_status(client)["done"]:
                break
            for peer in peers[turn % 4:] + peers[:turn % 4]:
                if peer is liar and relay.store.ban_reason(liar.peer_id):
                    continue
                job = peer.work(5)
                if "slot" not in job:
                    continue
                body = flipped(peer, job, relay) if peer is liar else peer.train(job)
                answer = peer.upload(job["round"], job["slot"], body)
                assert answer.status_code == 200 or (peer is liar and answer.status_code == 403), answer.json()
        status = session_status(client)
        banned = {peer.peer_id for peer in peers if relay.store.ban_reason(peer.peer_id)}
    assert status["done"], status
    assert banned == {liar.peer_id}, (banned, status["counters"])
    assert status["counters"]["disputes_settled_by_quorum"] >= 1, status["counters"]
    assert "replays_queued" not in status["counters"], status["counters"]


def test_a_result_whose_class_has_nobody_left_to_copy_it_goes_back_out_not_into_the_merge(
        text_package: Package, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two native peers trained the round's two units; one leaves before copying the other's. Its own result is
    copied by the one that stayed; the stayer's result has nobody of its class to copy it, so it is dropped and its
    unit handed out again rather than merged unchecked, taken out of the round's exact sum with its own weights (read
    back from SQLite: here the book keeps no result's weights, as it keeps none past a round's first 8), not left
    for the sum to be rebuilt from every result."""
    monkeypatch.setattr("server.relay.book.EARLY", 0)
    relay = classed_relay(text_package, tmp_path)
    with serving(relay) as client:
        stays, leaves = HttpPeer(client, engine_class=NATIVE), HttpPeer(client, engine_class=NATIVE)
        own = stays.assignment()
        other = leaves.assignment()
        assert stays.train_and_upload(own).status_code == 200 and leaves.train_and_upload(other).status_code == 200
        leaves.leave()
        copy = stays.work(5)
        assert copy.get("slot") == other["slot"] and "copy" not in copy, copy
        assert stays.train_and_upload(copy).status_code == 200
        status = session_status(client)
        assert status["counters"]["copies_identical"] == 1, status["counters"]
        assert status["counters"]["copies_unchecked_dropped"] == 1, status["counters"]
        assert status["round"] == 0 and status["round_progress"]["done"] == 1, status
        assert not relay.book.stale(0), "the dropped result left the round's sum to be rebuilt"
        assert "slot" not in stays.work(), "the peer whose result was dropped is not handed its unit again"
