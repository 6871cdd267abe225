"""What this machine can take at all: uploads of a result's size into a bare app, the anchor of the crowd's rate.

    .venv/bin/python -m server.bench.upload_floor [--clients 50] [--seconds 20] [--bytes 585000]

Starts uvicorn (the relay's server, with h11) on a one-route Starlette app, for ``--seconds`` each: one that reads
each body and drops it, one that also does what a relay cannot skip for a result it accepts (its sha256, and an insert
and commit of it into an SQLite file in WAL mode, as the relay's store does). ``--clients`` httpx clients (the crowd's
client) in this process upload random bodies of ``--bytes`` back to back. Prints uploads per second and the CPU
milliseconds per upload of the app and of the clients. Nothing of the relay runs: what ``peertrain bench crowd``
measures below this floor is the relay's own work (checks, copies, merges), and a rate goal above the floor cannot be
met on the machine by any relay that stores its results. ``bench crowd`` measures the second app before its
asynchronous setting (``--floor-seconds``) and prints the crowd's rate against it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from server.bench.load_figures import cpu_seconds, own_cpu_seconds
from server.harness.peer import run_async

APP = '''
import hashlib, os, sqlite3
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
STORE = os.environ["FLOOR_STORE"]
db = sqlite3.connect(STORE, check_same_thread=False) if STORE else None
if db is not None:
    db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS r (id INTEGER PRIMARY KEY, sha256 TEXT, body BLOB)")
async def upload(request):
    body = await request.body()
    if db is not None:
        db.execute("INSERT INTO r (sha256, body) VALUES (?, ?)", (hashlib.sha256(body).hexdigest(), body))
        db.commit()
    return JSONResponse({"bytes": len(body)})
app = Starlette(routes=[Route("/upload", upload, methods=["POST"])])
'''
LISTEN_TRIES = 300  # uvicorn has 30 s to listen


@dataclass
class Floor:
    """What one bare app took: ``uploads`` in ``seconds``, and the CPU milliseconds per upload of the app and of its
    clients."""

    stored: bool  # sha256, insert and commit (else: read and dropped)
    size: int
    uploads: int
    seconds: float
    app_ms: float
    clients_ms: float

    @property
    def per_second(self) -> float:
        return self.uploads / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        what = "received, hashed and stored in SQLite" if self.stored else "received and dropped"
        return (f"{self.uploads} uploads of {self.size:,} bytes {what} in {self.seconds:.1f} s = "
                f"{self.per_second:.0f}/s; CPU per upload: app {self.app_ms:.2f} ms, clients {self.clients_ms:.2f} ms")


def app_cpu_seconds(server: subprocess.Popen[bytes]) -> float:
    seconds = cpu_seconds(server.pid)
    if seconds is None:
        raise RuntimeError(f"the bare app exited with {server.poll()} while it was measured")
    return seconds


async def crowd(url: str, clients: int, seconds: float, body: bytes) -> int:
    done = 0

    async def client() -> None:
        nonlocal done
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            end = time.monotonic() + seconds
            while time.monotonic() < end:  # (bounded by the clock it is given)
                (await http.post("/upload", content=body)).raise_for_status()
                done += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return done


def measure(folder: Path, *, size: int, clients: int = 50, seconds: float = 10.0, stored: bool = True) -> Floor:
    """Run one bare app (``stored``: the one that hashes and stores each body in ``folder/floor.sqlite3``) under
    ``clients`` uploading ``size`` bytes each for ``seconds``."""
    folder.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (folder / "floor_app.py").write_text(APP)
    store = folder / "floor.sqlite3"
    for leftover in (store, store.with_name(store.name + "-wal"), store.with_name(store.name + "-shm")):
        leftover.unlink(missing_ok=True)
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "floor_app:app", "--port", str(port), "--log-level",
                               "warning", "--app-dir", str(folder)],
                              env={**os.environ, "FLOOR_STORE": str(store) if stored else ""})
    try:
        for _ in range(LISTEN_TRIES):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"the bare app exited with {server.returncode} before it listened") from None
                time.sleep(0.1)
        else:
            raise RuntimeError(f"the bare app did not listen on port {port} within {LISTEN_TRIES / 10:g} s")
        server_cpu, own_cpu = app_cpu_seconds(server), own_cpu_seconds()
        started = time.monotonic()
        body = os.urandom(size)
        done = run_async(lambda: crowd(f"http://127.0.0.1:{port}", clients, seconds, body))
        elapsed = time.monotonic() - started
        app_ms = 1000 * (app_cpu_seconds(server) - server_cpu) / max(done, 1)
        clients_ms = 1000 * (own_cpu_seconds() - own_cpu) / max(done, 1)
        return Floor(stored, size, done, elapsed, app_ms, clients_ms)
    finally:
        server.terminate()
        server.wait(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m server.bench.upload_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50, help="concurrent upload clients (default 50)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of uploads per app (default 20)")
    parser.add_argument("--bytes", type=int, default=585_000, help="bytes per upload (default 585000: a bytetext "
                        "int8 result)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        print(f"{args.clients} clients uploading {args.bytes:,} bytes each, {args.seconds:g} s per app", flush=True)
        for stored in (False, True):
            print(measure(Path(folder), size=args.bytes, clients=args.clients, seconds=args.seconds,
                          stored=stored).line(), flush=True)


if __name__ == "__main__":
    main()
