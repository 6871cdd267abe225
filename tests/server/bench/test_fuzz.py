"""``peertrain bench fuzz``, short: a few hundred requests generated from the OpenAPI document (Schemathesis) against
a real ``peertrain serve`` on 127.0.0.1. No 5xx, every refusal a documented code of its operation, and the
model unchanged by anything but a valid result (``server.bench.fuzz``); the 10,000-request run is in
BENCHMARKS.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from server.bench import fuzz
from server.relay import endpoints
from server.relay.app import RelayPaths

REQUESTS = 480  # (enough batches to reach every operation, the volunteers' three included)


@pytest.mark.slow
@pytest.mark.skipif(bool(RelayPaths().missing()), reason="set-up has not built web/node_modules and wheels/")
def test_a_short_fuzz_run_finds_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    fuzz.add_arguments(parser)
    out = tmp_path / "fuzz.json"
    args = parser.parse_args(["--requests", str(REQUESTS), "--batch", "10", "--seconds", "50",
                              "--work-dir", str(tmp_path / "work"), "--out", str(out)])
    status = fuzz.run(args)
    printed = capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert status == 0, "\n".join(f["check"] + ": " + f["detail"] for f in summary["findings"]) + printed
    assert summary["requests"] == REQUESTS and summary["5xx"] == 0 and not summary["findings"]
    assert sum(summary["by_status"].values()) == REQUESTS and "0" not in summary["by_status"]
    # Every route and method was fuzzed, in both of Schemathesis' modes, and refusals of many kinds came back.
    served = {f"{method} {endpoints.API.path}{route.path_format}"  # type: ignore[attr-defined]
              for route in endpoints.API.routes for method in route.methods}  # type: ignore[attr-defined]
    assert set(summary["by_operation"]) == served
    assert summary["by_mode"].get("positive") and summary["by_mode"].get("negative")
    assert summary["by_status"].get("200") and len(summary["error_codes"]) >= 8
    assert {"401 unauthorized", "400 bad_query"} <= set(summary["error_codes"])
    assert summary["checksum_checks"] >= REQUESTS // 10
    assert "check 5xx: 0 (anchor: 0)  ok" in printed and "by status:" in printed
