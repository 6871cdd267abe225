"""Fixtures for every folder of tests (each folder's conftest.py holds its own; plain helpers are modules beside
the tests that use them, never test modules: tests/test_shape.py holds that rule)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def one_blas_thread() -> Iterator[None]:
    """Numpy in this test's process on one BLAS thread, as `peertrain simulate` and `serve` run it: for tests that
    train many small batches in turn, where OpenBLAS's second thread only spins. Measured per test (quiet, two
    threads against one): the BPE pitfall 95 s against 35 s, the momentum trap 126 s against 49 s, the liveness ban
    test 111 s against 54 s. Not suite-wide: the demo-session test ran slower on one (54 s against 38 s)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


@pytest.fixture
def majority_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``examples/`` on sys.path for this test: native peers import ``majority_task`` as a relay started with
    ``--task majority_task:MajorityTask`` (and PYTHONPATH=examples) does."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield


# -- PostgreSQL --------------------------------------------------------------------------------------------------
# A server the tests start themselves, once per run (Debian's postgresql, which `make test` installs as root:
# scripts/ensure-postgresql), and a fresh database for each test that asks (pytest-postgresql's janitor creates and
# drops it). Not pytest-postgresql's own process fixture: PostgreSQL refuses to run as root, which CI is, and that
# fixture starts it as the current user; here it runs as the `postgres` user Debian's package creates.
@dataclass(frozen=True)
class PostgreSQLServer:
    host: str
    port: int
    user: str = "postgres"

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"


def postgresql_binaries() -> Path | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl), newest version first; None when not installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]), reverse=True)
    if found:
        return found[0].parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


@pytest.fixture(scope="session")
def postgresql_server() -> Iterator[PostgreSQLServer]:
    binaries = postgresql_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL is not installed (`make test` installs Debian's postgresql as root; or: apt-get "
                    "install postgresql)")
    as_postgres: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="peertrain-postgresql-"))  # (not under pytest's 0700 folder: see below)
    if os.geteuid() == 0:  # PostgreSQL will not run as root: run it as Debian's postgres user, who owns its folder
        if shutil.which("runuser") is None or not _user_exists("postgres"):
            pytest.skip("running as root, and no postgres user (or runuser) to run PostgreSQL as")
        as_postgres = ["runuser", "-u", "postgres", "--"]
        shutil.chown(folder, "postgres", "postgres")
    data, log = folder / "data", folder / "server.log"
    with socket.socket() as probe:  # (a free port on loopback; the server binds it a moment later)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        subprocess.run([*as_postgres, str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, timeout=120)
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off -c max_connections=200"
        subprocess.run([*as_postgres, str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options,
                        "-w", "-t", "60", "start"], check=True, capture_output=True, timeout=90)
    except subprocess.CalledProcessError as error:
        shutil.rmtree(folder, ignore_errors=True)
        server_log = log.read_text() if log.exists() else ""
        pytest.fail(f"PostgreSQL did not start: {error.stderr.decode(errors='replace')}{server_log}")
    try:
        yield PostgreSQLServer("127.0.0.1", port)
    finally:
        subprocess.run([*as_postgres, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture
def postgresql_url(postgresql_server: PostgreSQLServer) -> Iterator[str]:
    """The URL of a new, empty database on the tests' PostgreSQL server, dropped after the test."""
    from pytest_postgresql.janitor import DatabaseJanitor

    name = f"peertrain_{uuid.uuid4().hex[:12]}"
    janitor = DatabaseJanitor(user=postgresql_server.user, host=postgresql_server.host, port=postgresql_server.port,
                              dbname=name)
    janitor.init()
    try:
        yield postgresql_server.url(name)
    finally:
        janitor.drop()
