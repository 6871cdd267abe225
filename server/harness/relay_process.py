"""``peertrain serve`` in a child process, for benches and tests: start it, read the URL and admin token it prints,
wait until ``/healthz`` answers, stop it (SIGTERM, then SIGKILL), SIGKILL it, start it again on the same port.

The child's stdout and stderr go through one pipe that a reader thread drains into the log file line by line
(never an undrained pipe), so that the start waits on events: the line with the URL (or the end of the output,
when the process died), then the answer to one ``GET /healthz``. ``serve`` binds and listens before it prints
the URL, so that request waits in the listen queue until uvicorn runs instead of being refused. The first start
asks for port 0 (before the caller's arguments, so that a ``--port`` of theirs wins); a restart asks for the
port the first start got (after the caller's arguments), so the peers' URL stays the same.
"""

from __future__ import annotations

import math
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from server.harness.serve_command import ServeCommand
from server.paths import REPO_ROOT
from server.relay.client import RelayClient

EXAMPLES = REPO_ROOT / "examples"
URL_LINE = re.compile(rb"(https?://\S+?)/?\s+in a browser")
TOKEN_LINE = re.compile(rb"admin token \(shown once\): (\S+)")
TOKEN_ENV = "PEERTRAIN_ADMIN_TOKEN"


class RelayStartError(RuntimeError):
    """The relay did not start: it exited, printed no URL in time, or its health check failed."""


def option_value(arguments: Sequence[str], name: str) -> str | None:
    """The last value of ``name`` among command-line ``arguments`` (``--name V`` or ``--name=V``), as argparse
    reads it."""
    value = None
    for index, argument in enumerate(arguments):
        if argument == name and index + 1 < len(arguments):
            value = arguments[index + 1]
        elif argument.startswith(name + "="):
            value = argument.partition("=")[2]
    return value


class RelayProcess:
    """One ``peertrain serve`` child process (``python -m server.cli serve --port 0 *arguments``).

    ``serve`` is what it is started with: a ``ServeCommand`` (the settings as objects; serve's own switches that no
    settings object declares, or flags a user typed for a bench, in its ``extra``). ``env`` is added to this
    process's environment; ``examples`` puts ``examples/`` on the child's PYTHONPATH (tasks named as
    ``majority_task:MajorityTask``); ``python`` replaces the interpreter's command (e.g. with ``-m cProfile -o
    FILE``); ``stop_signal`` is what ``stop`` sends first (SIGINT lets cProfile write its stats). The log (``log``,
    default a file in $TMPDIR) holds every start's output, the first start's first."""

    def __init__(self, serve: ServeCommand, *, log: Path | None = None,
                 env: Mapping[str, str] | None = None, examples: bool = False, python: Sequence[str] | None = None,
                 stop_signal: signal.Signals = signal.SIGTERM, stop_timeout_s: float = 10.0,
                 start_timeout_s: float = 120.0, verify: ssl.SSLContext | bool = True) -> None:
        self.arguments = serve.arguments()
        self.log = log or Path(os.environ.get("TMPDIR", "/tmp")) / f"peertrain-relay-{os.getpid()}-{id(self)}.log"
        extra = dict(env or {})
        if examples:
            extra["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES), extra.get("PYTHONPATH"),
                                                                os.environ.get("PYTHONPATH")]))
        # Unbuffered: a SIGKILLed relay's last lines are in the log too.
        self.env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
        self.python = list(python) if python else [sys.executable]
        self.stop_signal, self.stop_timeout_s, self.start_timeout_s = stop_signal, stop_timeout_s, start_timeout_s
        self.verify = verify  # an https relay's CA (``serve --tls-cert``), for the harness's own requests
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.url = ""  # http://host:port, no trailing slash (a base URL for httpx)
        self.admin_token: str | None = None
        self.starts = 0
        self._reader: threading.Thread | None = None
        self._printed_url = threading.Event()
        self._announced = False  # this start's URL line went by
        self._clients: list[httpx.Client] = []

    # -- the process -------------------------------------------------------------------------------
    @property
    def command(self) -> list[str]:
        serve = [*self.python, "-m", "server.cli", "serve"]
        if self.port is None:
            return [*serve, "--port", "0", *self.arguments]
        return [*serve, *self.arguments, "--port", str(self.port)]

    @property
    def page_url(self) -> str:
        """The URL to open in a browser (the one ``serve`` prints, with its trailing slash)."""
        return self.url + "/"

    @property
    def pid(self) -> int:
        assert self.process is not None, "the relay was never started"
        return self.process.pid

    def peak_rss_mb(self) -> float:
        """The relay process's peak resident memory so far (Linux's VmHWM; its replay workers are processes of their
        own and not counted), in MB; 0 where /proc does not say."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0.0
        kilobytes = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), "0")
        return int(kilobytes) / 1024

    def cpu_seconds(self) -> float:
        """CPU time (user and system) the relay process and the children it waited for (its replay workers, once
        they ended) spent so far, in seconds; NaN where /proc does not say."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return math.nan
        return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # (utime stime cutime cstime)

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.url.split("://", 1)[-1].rpartition(":")
        return host, int(port)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def logs(self) -> str:
        """Everything the relay printed so far, over all its starts."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def start(self) -> float:
        """Start the relay and wait until it prints its URL and ``/healthz`` answers 200; returns the seconds it
        took. Raises ``RelayStartError`` (with the log's tail) when it does not, within ``start_timeout_s``."""
        if self.running:
            raise RuntimeError(f"the relay at {self.url} is running already")
        started = time.monotonic()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._printed_url.clear()
        self._announced, self.admin_token = False, None
        self.process = subprocess.Popen(self.command, cwd=REPO_ROOT, env=self.env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._drain, args=(self.process, "w" if not self.starts else "a"),
                                        daemon=True, name=f"relay-log-{self.process.pid}")
        self._reader.start()
        self.starts += 1
        if not self._printed_url.wait(self.start_timeout_s) or not self._announced:
            self._fail(f"printed no URL within {self.start_timeout_s:.0f} s")
        left = max(1.0, self.start_timeout_s - (time.monotonic() - started))
        try:  # (answered once uvicorn runs: the socket listens already)
            health = httpx.get(self.url + "/healthz", timeout=left, verify=self.verify)
        except httpx.HTTPError as error:
            self._fail(f"did not answer /healthz: {type(error).__name__}: {error}")
        if health.status_code != 200:
            self._fail(f"answered /healthz with {health.status_code}: {health.text[:300]}")
        return time.monotonic() - started

    def _drain(self, process: subprocess.Popen[bytes], mode: str) -> None:
        """Copy the child's output into the log; note its URL and admin token when they go by."""
        assert process.stdout is not None
        with self.log.open(mode + "b") as log:
            for line in iter(process.stdout.readline, b""):
                log.write(line)
                log.flush()
                token = TOKEN_LINE.search(line)
                if token:
                    self.admin_token = token.group(1).decode()
                found = URL_LINE.search(line)
                if found and not self._announced:
                    self.url = found.group(1).decode().rstrip("/")
                    self.port = self.host_port[1]
                    if self.admin_token is None:  # (printed before the URL when serve made one up)
                        self.admin_token = self._given_token()
                    self._announced = True
                    self._printed_url.set()
        process.stdout.close()
        self._printed_url.set()  # the output ended (the process is gone): a waiting start wakes up

    def _given_token(self) -> str | None:
        """The admin token the relay was given (it prints one only when it made one up)."""
        return option_value(self.arguments, "--admin-token") or self.env.get(TOKEN_ENV)

    def _fail(self, why: str) -> None:
        code = self.process.poll() if self.process is not None else None
        self.kill()
        raise RelayStartError(f"the relay {why} (exit code {code}); its log {self.log}:\n{self.logs[-3000:]}")

    def stop(self) -> int | None:
        """``stop_signal`` (SIGTERM), up to ``stop_timeout_s`` for the relay to exit, then SIGKILL; returns the
        exit code (None: it was never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                return self.kill()
        self._join_reader()
        return self.process.returncode

    def kill(self) -> int | None:
        """SIGKILL, no grace (what the chaos bench does to it); returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self._join_reader()
        return self.process.returncode

    def restart(self) -> float:
        """Stop (if running) and start again on the same port and arguments; returns the start's seconds."""
        self.stop()
        return self.start()

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=10)  # (a grandchild holding the pipe, e.g. ``--peers``, may keep it open)

    # -- talking to it -----------------------------------------------------------------------------
    def client(self, *, timeout: float = 30.0) -> RelayClient:
        """The relay's Python client over a new ``httpx.Client`` (closed when the context manager exits)."""
        http = httpx.Client(base_url=self.url, timeout=timeout, verify=self.verify)
        self._clients.append(http)
        return RelayClient(http)

    def admin_headers(self) -> dict[str, str]:
        if self.admin_token is None:
            raise RuntimeError("the relay's admin token is not known (it was neither given nor printed)")
        return {"Authorization": f"Bearer {self.admin_token}"}

    def close(self) -> None:
        """Stop the relay and close the clients ``client`` made."""
        try:
            self.stop()
        finally:
            for http in self._clients:
                http.close()
            self._clients.clear()

    def __enter__(self) -> RelayProcess:
        if not self.running:
            self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
