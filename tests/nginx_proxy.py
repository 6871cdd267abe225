"""Debian's nginx in front of a relay for the reverse-proxy tests, running ``deploy/nginx.conf`` itself: the file a
host installs, with the test's certificate, ports and folders put in for the example ones."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from server.paths import REPO_ROOT

SITE = REPO_ROOT / "deploy" / "nginx.conf"
START_TIMEOUT_S = 30.0


def nginx_binary() -> str:
    """The nginx binary, or the test is skipped with the reason (``make test`` installs it as root)."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx; `make test` does it as root)")
    return found


@dataclass
class Certificate:
    cert: Path
    key: Path
    authority: Path
    spki: str  # what Chromium's --ignore-certificate-errors-spki-list takes for the leaf


def certificate(folder: Path) -> Certificate:
    """A throw-away CA's certificate for 127.0.0.1 and localhost (trustme)."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, authority = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(authority))
    public = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return Certificate(cert, key, authority, base64.b64encode(hashlib.sha256(der).digest()).decode())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rendered_site(*, port: int, relay_port: int, certificate: Certificate, cache: Path,
                  second_port: int | None = None) -> str:
    """``deploy/nginx.conf`` with this test's values; every example value must be found (the file is what runs).
    ``second_port``: the second relay's line, uncommented (a replica serving beside the first)."""
    site = SITE.read_text()
    replacements = [
        ("/var/cache/nginx/peertrain", str(cache)),
        ("server 127.0.0.1:8000;", f"server 127.0.0.1:{relay_port};"),
        ("# server 127.0.0.1:8001;", f"server 127.0.0.1:{second_port};" if second_port else "# (no second relay)"),
        ("/etc/letsencrypt/live/peertrain.example.org/fullchain.pem", str(certificate.cert)),
        ("/etc/letsencrypt/live/peertrain.example.org/privkey.pem", str(certificate.key)),
        ("listen 443 ssl http2;", f"listen 127.0.0.1:{port} ssl http2;"),
    ]
    for example, value in replacements:
        assert example in site, f"deploy/nginx.conf no longer has {example!r}"
        site = site.replace(example, value)
    redirect = re.compile(r"server \{\n    listen 80;.*?\n\}\n", re.S)  # (the port-80 redirect: not on a test port)
    assert redirect.search(site), "deploy/nginx.conf no longer has its port-80 redirect"
    return redirect.sub("", site)


@contextmanager
def nginx_in_front(relay_port: int, folder: Path, *, second_port: int | None = None
                   ) -> Iterator[tuple[str, Certificate]]:
    """nginx on a free port of 127.0.0.1, TLS with a throw-away CA, in front of the relay (and ``second_port``'s);
    (https URL, certificate). Stopped (and waited for) on exit."""
    binary = nginx_binary()
    folder.mkdir(parents=True, exist_ok=True)
    issued = certificate(folder)
    port = free_port()
    site = folder / "site.conf"
    site.write_text(rendered_site(port=port, relay_port=relay_port, certificate=issued, cache=folder / "cache",
                                  second_port=second_port))
    temp = {name: folder / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(exist_ok=True)
    main = folder / "nginx.conf"
    main.write_text(
        ("user root root;\n" if os.geteuid() == 0 else "")  # (workers read the test's 0700 folders)
        + f"worker_processes 1;\ndaemon off;\npid {folder / 'nginx.pid'};\nerror_log {folder / 'error.log'} info;\n"
        + "events { worker_connections 1024; }\n"
        + f"http {{\n  access_log {folder / 'access.log'};\n"
        + "".join(f"  {name}_temp_path {path};\n" for name, path in temp.items())
        + f"  include {site};\n}}\n")
    checked = subprocess.run([binary, "-t", "-p", str(folder), "-c", str(main)], capture_output=True, text=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen([binary, "-p", str(folder), "-c", str(main)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else "nginx exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"nginx did not listen on {port} within {START_TIMEOUT_S:g} s"
                time.sleep(0.1)
        yield f"https://127.0.0.1:{port}", issued
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stderr is not None:
            process.stderr.close()
