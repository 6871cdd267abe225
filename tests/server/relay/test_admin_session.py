"""``POST /api/admin/session``: a new session over HTTP, admin only; refused requests change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from relay_fixtures import ADMIN_TOKEN, HttpPeer, make_relay, run_round, serving, session_status

from server.session.package import Package
from server.session.session import Session

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_new_session_over_http(package: Package, tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    """On either store: the old session's SQLite file moves to the archive folder with its checkpoints, or its
    PostgreSQL tables to a schema of their own, named in the archive folder."""
    session_dir = tmp_path / "session"
    location = request.getfixturevalue("postgresql_url") if store == "postgresql" else None
    relay = make_relay(package, session_dir, k=2, passes=1, store=location)
    with serving(relay) as client:
        first, second = HttpPeer(client), HttpPeer(client)
        run_round(client, [first, second])
        before = (session_dir / "session.json").read_text()

        def create(body: object, headers: dict[str, str] = ADMIN) -> tuple[int, dict]:
            response = client.post("/api/admin/session", headers=headers, content=json.dumps(body))
            return response.status_code, response.json()

        assert create({"passes": 2}, headers={})[0] == 401
        status, body = create({"passes": 2})
        assert (status, body["error"]) == (409, "session_running")
        status, body = create({"passes": 2, "colour": "red", "replace": True})
        assert (status, body["error"]) == (422, "bad_session") and "colour" in body["message"]
        status, body = create({"merge": "fedavgm", "replace": True})  # one round covers half of the data
        assert (status, body["error"]) == (422, "bad_session") and "FedAvg" in body["message"]
        status, body = create({"participants": 0, "replace": True})
        assert status == 422
        # Nothing above touched the running session or its files.
        assert (session_dir / "session.json").read_text() == before
        assert not (session_dir / "archive").exists()
        assert relay.session.round == 1 and first.work().get("round") is not None

        status, body = create({"participants": 1, "passes": 2, "seed": 7, "replace": True})
        assert status == 200, body
        archived = Path(body["archived"])
        assert archived == session_dir / "archive" / "001"
        assert json.loads((archived / "session.json").read_text()) == json.loads(before)
        assert len((archived / "history.jsonl").read_text().splitlines()) == 1
        status_now = session_status(client)
        assert status_now["round"] == 0 and status_now["plan"]["participants_per_round"] == 1
        assert status_now["num_rounds"] == 2 * package.data.num_units

        # Old tokens lived in the archived store: peers join again and train the new session.
        assert client.post("/api/work", headers=first.headers).status_code == 401
        again = HttpPeer(client)
        run_round(client, [again])
        assert session_status(client)["round"] == 1
        assert relay.store.peer_count() == 1 and len(relay.store.all_results()) == 1
    if location is not None:
        assert (archived / "store.txt").read_text().startswith("this session's store: schema archive_001 ")
        assert not (archived / "relay.sqlite3").exists() and not (session_dir / "relay.sqlite3").exists()
        with psycopg.connect(location) as db:  # the old session's rows, where the archive folder says
            assert db.execute("SELECT COUNT(*) FROM archive_001.peers").fetchone() == (2,)
            assert db.execute("SELECT COUNT(*) FROM archive_001.results").fetchone() == (2,)
    else:
        assert (archived / "relay.sqlite3").is_file()

    restored = Session.restore(session_dir, package)
    assert restored.config.seed == 7 and restored.round == 1


def test_an_async_session_from_the_admin_api_keeps_replays_and_says_what_a_ban_undoes(package: Package,
                                                                                     tmp_path: Path) -> None:
    """The admin API's new session goes through serve's rules: async keeps host replays on a relay that verifies, and
    the page's defences say what the session does (a ban undoes nothing merged: a stream has no rounds to merge
    again), and a later sync session says what it does."""
    relay = make_relay(package, tmp_path / "session", k=2, passes=1, verify=True)
    with serving(relay) as client:
        def defenses() -> tuple[str, str]:
            listed = session_status(client)["defenses"]
            return " ".join(listed["guards"]), " ".join(listed["not_covered"])

        guards, missing = defenses()
        assert "re-trained on the host" in guards and "host replays are off" not in missing
        created = client.post("/api/admin/session", headers=ADMIN, content=json.dumps({"mode": "async",
                                                                                       "replace": True}))
        assert created.status_code == 200, created.json()
        assert relay.session.config.mode == "async" and relay.options.verify and relay.verification.active
        guards, missing = defenses()
        assert "re-trained on the host" in guards and "and outliers" not in guards and "pointing away" not in guards
        assert "host replays are off" not in missing and "merged before its ban stay merged" in missing
        again = client.post("/api/admin/session", headers=ADMIN, content=json.dumps({"mode": "sync", "replace": True}))
        assert again.status_code == 200, again.json()
        assert relay.options.verify and "re-trained on the host" in defenses()[0]
