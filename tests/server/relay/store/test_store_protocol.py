"""The ``Store`` protocol and its implementations agree: every member it declares exists on the SQLite and the
PostgreSQL store with the same signature, the part owning each concept has that concept's methods, and neither
store offers the relay anything another would lack. Opening a store from a location."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from server.relay.store import SCHEMES, Store, StoreUnavailable, UnsupportedStore, open_store
from server.relay.store.concepts import CounterStore
from server.relay.store.postgresql import PostgreSQLStore
from server.relay.store.protocol import CONCEPTS, StoreLifecycle
from server.relay.store.sql.arrivals import SQLArrivals
from server.relay.store.sql.bans import SQLBans
from server.relay.store.sql.copies import SQLCopies
from server.relay.store.sql.counters import SQLCounters
from server.relay.store.sql.forwarded import SQLForwarded
from server.relay.store.sql.leases import SQLLeases
from server.relay.store.sql.pause import SQLPause
from server.relay.store.sql.peers import SQLPeers
from server.relay.store.sql.refusals import SQLRefusals
from server.relay.store.sql.replay_jobs import SQLReplayJobs
from server.relay.store.sql.results import SQLResults
from server.relay.store.sql.undos import SQLUndos
from server.relay.store.sql.volunteers import SQLVolunteers
from server.relay.store.sqlite import SQLiteStore

PARTS = dict(zip(CONCEPTS[1:], (SQLPeers, SQLLeases, SQLResults, SQLCopies, SQLArrivals, SQLBans, SQLUndos,
                                SQLReplayJobs, SQLVolunteers, SQLPause, SQLRefusals, SQLRefusals, SQLForwarded,
                                SQLCounters),
                                strict=True))


def members(protocol: type) -> dict[str, object]:
    """The names a protocol declares itself (not through the protocols it extends), with what it declares (an
    attribute: its annotation)."""
    declared = {name: value for name, value in vars(protocol).items() if not name.startswith("_")}
    return declared | dict(vars(protocol).get("__annotations__", {}))


def declared_signature(member: object) -> inspect.Signature:
    return inspect.signature(member.fget if isinstance(member, property) else member)  # type: ignore[arg-type]


def test_the_store_is_the_union_of_its_concepts() -> None:
    assert CONCEPTS[0] is StoreLifecycle and CONCEPTS[-1] is CounterStore
    assert set(Store.__mro__) >= set(CONCEPTS)
    names = [name for concept in CONCEPTS for name in members(concept)]
    assert len(names) == len(set(names))  # (no member declared by two concepts)
    assert members(Store) == {}  # (Store adds nothing of its own)


@pytest.mark.parametrize("implementation", [SQLiteStore, PostgreSQLStore], ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("concept", CONCEPTS, ids=lambda concept: concept.__name__)
def test_each_store_has_every_member_with_its_signature(concept: type, implementation: type) -> None:
    for name, declared in members(concept).items():
        implemented = inspect.getattr_static(implementation, name, None)
        assert implemented is not None, f"{implementation.__name__} lacks {name}"
        if isinstance(declared, str):  # (an attribute: a value of the annotated type)
            assert isinstance(implemented, eval(declared)), name  # noqa: S307 (the protocol's own annotation)
            continue
        assert isinstance(implemented, property) == isinstance(declared, property), name
        assert declared_signature(implemented) == declared_signature(declared), name


@pytest.mark.parametrize("concept", CONCEPTS[1:], ids=lambda concept: concept.__name__)
def test_each_concept_has_a_sqlite_part_with_its_methods(concept: type) -> None:
    part = PARTS[concept]
    for name, declared in members(concept).items():
        assert declared_signature(getattr(part, name)) == declared_signature(declared), f"{part.__name__}.{name}"


@pytest.mark.parametrize("implementation", [SQLiteStore, PostgreSQLStore], ids=lambda cls: cls.__name__)
def test_no_store_offers_anything_beyond_the_protocol(implementation: type) -> None:
    """What the relay may call on a store is what every store has: the rest is each store's own (its connection,
    for a test of that database only)."""
    offered = {name for name in dir(implementation) if not name.startswith("_")}
    declared = {name for concept in CONCEPTS for name in members(concept)}
    assert offered == declared


def test_a_store_opens_from_a_path_or_a_sqlite_url(tmp_path: Path) -> None:
    for location in (tmp_path / "a" / "relay.sqlite3", str(tmp_path / "b.sqlite3"), f"sqlite:///{tmp_path}/c.db",
                     f"SQLITE:///{tmp_path}/d.db"):
        store = open_store(location)
        try:
            assert isinstance(store, SQLiteStore) and store.path.is_absolute() and store.path.is_file()
        finally:
            store.close()
    assert [p.name for p in sorted(tmp_path.rglob("*.sqlite3"))] == ["relay.sqlite3", "b.sqlite3"]


def test_a_relative_sqlite_url_is_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///runs/relay.sqlite3")
    try:
        assert store.path == Path("runs/relay.sqlite3") and (tmp_path / "runs" / "relay.sqlite3").is_file()
    finally:
        store.close()


@pytest.mark.parametrize("location", ["mysql://relay:secret@db.example/peertrain", "redis://x/y"])
def test_another_scheme_is_refused_naming_the_supported_ones(location: str) -> None:
    with pytest.raises(UnsupportedStore) as refused:
        open_store(location)
    message = str(refused.value)
    assert location.split("://")[0] + "://" in message and "sqlite:///PATH" in message and "postgresql://" in message
    assert set(SCHEMES) == {"sqlite", "postgresql"}
    assert "secret" not in message  # (a URL's password never reaches a log)


def test_a_postgresql_url_opens_a_postgresql_store(postgresql_url: str) -> None:
    for location in (postgresql_url, postgresql_url.replace("postgresql://", "postgres://", 1)):
        store = open_store(location)
        try:
            assert isinstance(store, PostgreSQLStore) and store.path is None and store.disk_bytes() == 0
            store.count("opened")
        finally:
            store.close()
    again = open_store(postgresql_url)  # (the tables exist: opened, not created, and the data is there)
    try:
        assert again.counters() == {"opened": 2}
    finally:
        again.close()


def test_a_postgresql_server_that_is_not_there_is_an_error_without_the_password() -> None:
    with pytest.raises(StoreUnavailable) as failed:
        open_store("postgresql://relay:secret@127.0.0.1:1/peertrain?connect_timeout=5")
    assert "secret" not in str(failed.value)


@pytest.mark.parametrize("location", ["sqlite://host/relay.sqlite3", "sqlite:///", "sqlite://"])
def test_a_sqlite_url_with_a_host_or_no_path_is_refused(location: str) -> None:
    with pytest.raises(UnsupportedStore, match="sqlite:///PATH"):
        open_store(location)
