"""``peertrain bench attacks``: the attackers' maths with numbers checkable by hand, the bench's grid and report,
native peers (honest and attacking) driving a real relay over HTTP, and (slow) the quick bench end to end.

The last test holds the relay's defaults to account: with one attacker in three on arith, the relay as shipped
(its default aggregator and checks) ends within 10 points of its honest run under each of the five upload
attacks, while ``mean`` (plain FedAvg) with the relay's switchable checks off does not under flip and
noise_claim (unless a check without a switch refused those uploads).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import pytest
from relay_fixtures import EXAMPLE, REPO_ROOT, build_small_package

from runtime import wire
from runtime.weights import WeightSpec
from server.bench import BENCHES
from server.bench.attack_peers import (
    CLAIMED_EXAMPLES,
    RunSpec,
    Trainer,
    drive,
    flip,
    free_rider,
    little_is_enough,
    noise,
    paper_z,
    poisoned,
    scaled,
)
from server.bench.attack_report import COLUMNS, relative, shown
from server.bench.attack_runs import RelayFeatures, default_aggregate, relay_features, serve_args
from server.bench.attacks import FULL, FULL_K, QUICK, Section, planned_runs, supported
from server.browser.launcher import relay_process

G = np.array([1.0, 2.0, -1.0, 0.5], dtype=np.float32)
W = np.array([1.5, 1.0, -1.0, 0.75], dtype=np.float32)  # an honest result: update u = w - g = [0.5, -1, 0, 0.25]


def test_flip_is_global_minus_four_updates() -> None:
    assert flip(G, W).tolist() == [-1.0, 6.0, -1.0, -0.5]  # g - 4 u
    assert flip(G, W).dtype == np.float32


def test_free_rider_uploads_the_global_weights_unchanged() -> None:
    out = free_rider(G)
    assert out.tolist() == G.tolist() and out is not G


def test_scaled_is_one_and_a_half_updates_plus_small_noise() -> None:
    out = scaled(G, W, np.random.default_rng(3))
    expected = np.array([1.75, 0.5, -1.0, 0.875]) + np.random.default_rng(3).normal(0.0, 0.01, 4)  # g + 1.5 u + e
    assert np.allclose(out, expected, atol=1e-6)
    big = scaled(np.zeros(100_000, np.float32), np.ones(100_000, np.float32), np.random.default_rng(0))
    assert abs(float(big.mean()) - 1.5) < 1e-3 and abs(float(big.std()) - 0.01) < 1e-3


def test_noise_is_the_global_weights_plus_gaussian_noise_of_std_005() -> None:
    out = noise(np.full(100_000, 2.0, np.float32), np.random.default_rng(0)) - 2.0
    assert abs(float(out.mean())) < 1e-3 and abs(float(out.std()) - 0.05) < 1e-3


def test_little_is_enough_is_mean_minus_z_std_per_coordinate() -> None:
    # Two colluders' honest updates [1, 0, 2, -1] and [3, 0, 4, 1]: mean [2, 0, 3, 0], std (ddof 0) [1, 0, 1, 1].
    colluders = [G + np.array([1, 0, 2, -1], np.float32), G + np.array([3, 0, 4, 1], np.float32)]
    assert (little_is_enough(G, colluders, 1.0) - G).tolist() == [1.0, 0.0, 2.0, -1.0]
    assert (little_is_enough(G, colluders, 0.5) - G).tolist() == [1.5, 0.0, 2.5, -0.5]
    assert (little_is_enough(G, colluders[:1], 1.0) - G).tolist() == [1.0, 0.0, 2.0, -1.0]  # alone: std 0


def test_paper_z_follows_baruch_et_al() -> None:
    # s = floor(n/2 + 1) - f; z = Phi^-1((n - s) / n). n = 10: s = 5, 4, 3, 2 for f = 1..4.
    assert paper_z(10, 1) == pytest.approx(0.0, abs=1e-12)
    assert paper_z(10, 3) == pytest.approx(NormalDist().inv_cdf(0.7))
    assert paper_z(10, 4) == pytest.approx(0.8416, abs=1e-4)
    assert paper_z(50, 12) == pytest.approx(NormalDist().inv_cdf(36 / 50))


def test_poisoned_keeps_the_header_and_claims_only_for_noise_claim() -> None:
    spec = WeightSpec(entries=(("w", (4,)),))
    header = wire.WireHeader(spec=spec, round=3, fingerprint="abc", num_examples=200, metrics={"train_loss": 1.0},
                             meta={"slot": 2, "unit_index": 7})
    honest = wire.encode(W, header)
    for attack in ("flip", "free_rider", "scaled", "little_is_enough", "noise_claim"):
        out_header, vector = wire.decode(poisoned(attack, honest, G, rng=np.random.default_rng(0), colluders=[W]))
        assert (out_header.round, out_header.fingerprint, out_header.meta) == (3, "abc", header.meta)
        assert out_header.num_examples == (CLAIMED_EXAMPLES if attack == "noise_claim" else 200)
        if attack == "flip":
            assert vector.tolist() == [-1.0, 6.0, -1.0, -0.5]
        if attack in ("free_rider",):
            assert vector.tolist() == G.tolist()
        if attack == "little_is_enough":  # one colluder: std 0, its own update
            assert vector.tolist() == W.tolist()
    with pytest.raises(ValueError, match="unknown attack"):
        poisoned("sybil", honest, G, rng=np.random.default_rng(0))


def test_relative_in_points_and_as_a_ratio() -> None:
    assert relative(0.6, 0.8, True) == pytest.approx(-20.0) and shown(-20.0, True) == "-20.0 pts"
    assert relative(2.2, 2.0, False) == pytest.approx(1.1) and shown(1.1, False) == "1.100x"
    assert relative(None, 0.8, True) is None and shown(None, True) == "-"


def test_the_grid_runs_each_attacker_count_once_with_mean_honest_first() -> None:
    section = Section("t", "arith", ("trimmed_mean", "mean"), ("flip", "sybil"), (0.3, 0.34), honest_first=1)
    runs = [(p.aggregator, p.attack, p.fraction, p.attackers, p.honest_first) for p in planned_runs(section, 3)]
    assert runs == [("mean", "none", 0.0, 0, 0), ("trimmed_mean", "none", 0.0, 0, 0),
                    ("trimmed_mean", "flip", 0.3, 1, 1), ("trimmed_mean", "sybil", 0.0, 0, 1),
                    ("mean", "flip", 0.3, 1, 1), ("mean", "sybil", 0.0, 0, 1)]
    ten = planned_runs(Section("t", "arith", ("mean",), ("scaled",), (0.1, 0.2, 0.3, 0.4)), 10)
    assert [p.attackers for p in ten] == [0, 1, 2, 3, 4]


def test_the_full_grid_shares_its_honest_runs() -> None:
    features = RelayFeatures(frozenset({"--aggregate"}), "centered_clipping", {})  # default: its own settings
    sections = supported(list(FULL), features, {})
    assert "default" not in sections[2].aggregators and "default" in sections[0].aggregators
    distinct = {p.key for section in sections for p in planned_runs(section, FULL_K)}
    # shipped arith: 2 honest + 2 x 6 attacks; patient: 2 x 4 x 2 (its honest runs are the shipped ones);
    # aggregators alone: 6 honest + 6 x 4; shipped bytetext: 2 + 2 x 6
    assert len(distinct) == 14 + 16 + 30 + 14
    assert supported(list(FULL), features, {"centered_clipping": '{"radius": 1}'}) == list(FULL)
    assert all(p.attackers == 1 for p in planned_runs(QUICK[0], 3) if p.attack != "none")


HELP = """usage: peertrain serve [-h] [--aggregate {mean,median}]

options:
  --merge {fedavg,fedavgm,fedadam}
                        the merge method (default fedavg)
  --aggregate {mean,median,trimmed_mean,krum,multikrum,centered_clipping}
                        how a round's results become one average before the
                        merge's step (default trimmed_mean with {"fraction":
                        0.3333333333333333}; mean: plain FedAvg)
  --aggregate-config JSON
                        the aggregator's settings as JSON (default: its own defaults)
"""


def test_the_default_aggregator_is_read_from_serve_help() -> None:
    assert default_aggregate(HELP) == ("trimmed_mean", {"fraction": 0.3333333333333333})
    plain = HELP.replace('with {"fraction":\n                        0.3333333333333333}', "with {}")
    assert default_aggregate(plain) == ("trimmed_mean", {})
    assert default_aggregate(HELP.replace("--aggregate {", "--other {")) == (None, None)
    without = RelayFeatures(frozenset(), None)  # a relay of plain FedAvg only: mean and default run
    sections = supported([Section("t", "arith", ("mean", "krum", "default"), ("flip",), (0.3,))], without, {})
    assert sections[0].aggregators == ("mean", "default")


def test_attacks_is_a_registered_bench() -> None:
    assert BENCHES["attacks"] == ("server.bench.attacks",)


def test_native_peers_drive_a_real_relay_with_a_flipping_attacker_and_sybils(tmp_path: Path) -> None:
    """Three peers (one flips) on the majority task, then a sybil address that tries 6 joins against a relay
    allowing 2 live peers per address: the sessions finish, the refused joins are counted by code."""
    package = build_small_package(tmp_path / "package", EXAMPLE)
    features = relay_features()
    trainers: dict[str, Trainer] = {}
    try:
        arguments = serve_args(package.path, tmp_path / "s1", 3, 2, "default", features)
        with relay_process(*arguments, log_path=tmp_path / "s1.log") as url:
            status, seen = drive(RunSpec(url=url.rstrip("/"), attack="flip", attackers=1, k=3, timeout_s=120),
                                 trainers)
        counters = status["counters"]
        assert status["done"] and len(status["history"]) == status["num_rounds"] == 3, status
        assert sum(entry["participants"] for entry in status["history"]) == 8  # 4 chunks x 2 passes: 3 + 3 + 2
        assert seen.joins == {"honest admitted": 2, "flip admitted": 1} and not seen.stalled
        assert seen.attempted("flip") >= 1 and seen.trained + seen.reused >= 8
        assert counters["results_accepted"] == seen.accepted("honest") + seen.accepted("flip"), (counters, seen)
        if "--no-verify" in features.flags:  # the host replays every peer's first result: the flipper is banned
            assert counters.get("peers_banned") == 1, (counters, seen.uploads)

        cap = ["--max-peers-per-address", "2"] if "--max-peers-per-address" in features.flags else []
        arguments = serve_args(package.path, tmp_path / "s2", 3, 2, "default", features, extra=cap)
        with relay_process(*arguments, log_path=tmp_path / "s2.log") as url:
            status, seen = drive(RunSpec(url=url.rstrip("/"), attack="sybil", attackers=0, k=3, sybil_joins=6,
                                         timeout_s=120), trainers)
        assert status["done"] and seen.joins["honest admitted"] == 3, seen.joins
        if "--trusted-proxy-header" in features.flags and cap:  # one address for six sybil joins: 2 in, 4 out
            assert seen.joins == {"honest admitted": 3, "sybil admitted": 2, "sybil refused.too_many_peers": 4}
            assert status["counters"]["refused.too_many_peers"] == 4
        assert len(trainers) == 1 and next(iter(trainers.values())).reused >= 1  # round 0 trained once for both
    finally:
        for trainer in trainers.values():
            trainer.close()


def bench(out: Path, *more: str, timeout: float = 900) -> dict:
    command = [sys.executable, "-m", "server.cli", "bench", "attacks", "--quick", "--out", str(out), *more]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    result["stdout"] = done.stdout
    return dict(result)


def table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]


@pytest.mark.slow
def test_quick_bench_prints_a_table_per_task_and_writes_json(tmp_path: Path) -> None:
    result = bench(tmp_path / "attacks.json")
    runs = result["runs"]
    assert len(runs) == len(planned_runs(QUICK[0], result["k"])) == 8 and len(result["sections"]) == 1
    assert all(r["error"] is None and r["rounds"] == r["num_rounds"] > 0 for r in runs), runs
    # one progress line per run, then the table: header, separator, one row per run
    progress = [line for line in result["stdout"].splitlines() if re.match(r"arith +\S+ +\S+ +\d\.\d\d \(", line)]
    assert len(progress) == len(runs)
    rows = table_rows(result["tables"])
    assert rows[0][0] == "aggregator" and len(rows[0]) == len(COLUMNS)
    assert len(rows) == 2 + len(runs) and all(len(row) == len(COLUMNS) for row in rows)
    honest_mean = next(r for r in runs if r["aggregator"] == "mean" and r["attack"] == "none")
    assert honest_mean["vs_mean"] == 0.0 and honest_mean["value"] > 0.5  # the anchor learnt
    assert all(r["vs_honest"] is not None and r["vs_mean"] is not None for r in runs)
    assert result["tables"] in result["stdout"]


def relay_has_aggregate() -> bool:
    return relay_features().aggregate


FIVE = "noise_claim,flip,free_rider,scaled,little_is_enough"


@pytest.mark.slow
def test_default_aggregator_holds_where_mean_does_not(tmp_path: Path) -> None:
    """Arith, k = 3, one attacker: the relay as shipped (its default aggregator and checks) ends within 10
    points of its honest run under each upload attack; mean without the relay's switchable checks does not
    under flip and noise_claim (an upload the relay still refuses, as noise_claim's claim, reached nothing)."""
    if not relay_has_aggregate():
        pytest.skip("`peertrain serve --help` has no --aggregate yet: the robust defaults have not landed")
    shipped = bench(tmp_path / "shipped.json", "--attacks", FIVE, "--aggregators", "default")
    runs = {r["attack"]: SimpleNamespace(**r) for r in shipped["runs"] if r["aggregator"] == "default"}
    assert all(r.attackers == 1 for name, r in runs.items() if name != "none")  # one attacker in three
    for attack in FIVE.split(","):
        held = runs[attack]
        assert held.vs_honest >= -10.0, (f"default aggregator ({held.relay_aggregator}) under {attack}: "
                                         f"{held.vs_honest:+.1f} points against its honest run; {held.uploads}")
    alone = bench(tmp_path / "alone.json", "--attacks", "flip,noise_claim", "--aggregators", "mean",
                  "--relay-checks", "off")
    for attack in ("flip", "noise_claim"):
        fell = next(SimpleNamespace(**r) for r in alone["runs"] if r["attack"] == attack)
        if fell.uploads.get(f"{attack} accepted", 0) == 0:
            continue  # the relay refused every such upload with a check that has no switch: nothing reached mean
        assert fell.vs_honest < -10.0, (f"mean under {attack} ended {fell.vs_honest:+.1f} points from its honest "
                                        f"run: the attack did not bite; {fell.uploads}, refused {fell.refusals}")
    assert any(r["uploads"].get(f"{r['attack']} accepted", 0) for r in alone["runs"] if r["attack"] != "none"), \
        "with its checks off the relay still refused every poisoned upload"
