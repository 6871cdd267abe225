"""What this machine can take at all: uploads of a result's size into a bare app, the anchor for the crowd's rate.

    .venv/bin/python scripts/upload-floor.py [--clients 50] [--seconds 20] [--bytes 585000]

Starts uvicorn (the relay's server, with h11) on a one-route Starlette app twice, each for ``--seconds``: one that
reads each body and drops it, one that also does what the relay cannot skip for a result (its sha256, and an insert
and commit of it into an SQLite file in WAL mode, as the relay's store). ``--clients`` httpx clients in this process
upload random bodies of ``--bytes`` (a bytetext int8 result: 585 KB) back to back. Prints uploads per second and the
CPU milliseconds per upload of the app and of the clients. Nothing of the relay runs: what the crowd bench measures
above this floor is the relay's own work (checks, copies, merges)."""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

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


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def run(store: str, args: argparse.Namespace, folder: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (folder / "floor_app.py").write_text(APP)
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "floor_app:app", "--port", str(port), "--log-level",
                               "warning", "--app-dir", str(folder)], env={**os.environ, "FLOOR_STORE": store})
    try:
        for _ in range(300):  # (bounded: 30 s for uvicorn to listen)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        server_cpu, own_cpu = cpu_seconds(server.pid), resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        done = asyncio.run(crowd(f"http://127.0.0.1:{port}", args.clients, args.seconds, os.urandom(args.bytes)))
        elapsed = time.monotonic() - started
        app_ms = 1000 * (cpu_seconds(server.pid) - server_cpu) / max(done, 1)
        after = resource.getrusage(resource.RUSAGE_SELF)
        clients_ms = 1000 * (after.ru_utime + after.ru_stime - own_cpu.ru_utime - own_cpu.ru_stime) / max(done, 1)
        what = "sha256 + SQLite insert and commit" if store else "body read and dropped"
        print(f"{what}: {done} uploads in {elapsed:.1f} s = {done / elapsed:.0f}/s; CPU per upload: app "
              f"{app_ms:.2f} ms, clients {clients_ms:.2f} ms", flush=True)
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50, help="concurrent upload clients (default 50)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of uploads per app (default 20)")
    parser.add_argument("--bytes", type=int, default=585_000, help="bytes per upload (default 585000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print(f"{args.clients} clients uploading {args.bytes:,} bytes each, {args.seconds:g} s per app", flush=True)
        run("", args, Path(folder))
        run(str(Path(folder) / "floor.sqlite3"), args, Path(folder))


if __name__ == "__main__":
    main()
