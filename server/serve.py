"""``peertrain serve``: bind, print the URL to join, run the relay under uvicorn."""

from __future__ import annotations

import socket
import sys

import uvicorn

from server.app import RelayPaths, create_app


def bind(host: str, port: int) -> socket.socket:
    """Bind before starting uvicorn so that port 0 yields a real port we can print."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def join_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def serve(*, host: str, port: int, log_level: str = "warning", paths: RelayPaths | None = None) -> int:
    paths = paths or RelayPaths()
    problems = paths.missing()
    if problems:
        for problem in problems:
            print(f"peertrain serve: {problem}", file=sys.stderr)
        return 2
    try:
        sock = bind(host, port)
    except OSError as error:
        print(f"peertrain serve: cannot listen on {host}:{port}: {error.strerror}", file=sys.stderr)
        return 2
    url = join_url(host, sock.getsockname()[1])
    print(f"peertrain relay listening. Open {url} in a browser to join.", flush=True)
    config = uvicorn.Config(create_app(paths), log_level=log_level, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
    return 0
