"""``peertrain bench fuzz``: requests generated from the relay's OpenAPI document against a real relay.

A ``peertrain serve`` subprocess on 127.0.0.1 (port 0; the majority example, 4 chunks, k = 2, an admin token,
``--min-peers 1`` so that the fuzzer's own peer is handed units, ``--no-verify`` so that a result of its that is
accepted does not get it banned) publishes ``/api/openapi.json`` (``server.relay.openapi``). Schemathesis turns
each operation into a Hypothesis strategy, in both of its modes: requests that fit the document (positive) and
requests that break it (negative: wrong types, missing parameters, bodies of another shape). The fuzzer sends
them itself over one ``requests`` session (of an event stream it reads the first event, then closes it), with
the token of a peer it joined on peer operations and the admin token on admin ones, except one request in ten
(``WRONG_AUTH_SHARE``) that goes with a wrong token or none. Half the result uploads (``MUTATED_RESULT_SHARE``)
carry a real result message instead (the round's weights), damaged in up to three places or not at all (half
of them with the wire checksum recomputed, ``wire.reseal``), mostly for the (round, slot) the fuzzer's peer
holds, so that the checks behind the wire framing and its checksum are reached too.
Operations take turns, ``--batch`` requests each, until ``--requests`` requests or ``--seconds`` seconds.

Checks, after every request:

* no 5xx, no error in transport (a timeout or a dropped connection counts as a failure too);
* every 4xx is JSON with an ``error`` code that the document lists for that operation and status (HEAD
  answers carry no body: their status and content type are checked);
* every status is one the document lists for the operation;
* the model's checksum (sha256 of the weights and metadata of ``GET /api/admin/export/model``, fetched after
  every request that is not a GET or HEAD and after every ``--checksum-every``-th one) is unchanged, except
  after an accepted result (once a merge it may start is over) or an accepted ``POST /api/admin/session`` (a
  new session), which re-take it, and after a round merged because its last slot was refused to every connected
  peer (docs/liveness.md): then the session's status must show that round merged and no more results merged in
  all than it accepted.

After a new session the peer token is void (tokens live in the session's SQLite file): the fuzzer joins again;
after a fuzz request stopped the session, or once every round merged, it asks for a new one, so that the
fuzzing keeps meeting a live session (none of these is counted among the fuzz requests). It prints progress
lines, the requests by operation and by status, the refusal codes seen and each check's outcome, and writes
the figures as JSON (``--out``). Exit status 1 when a check failed.

Schemathesis 4 fits Starlette 1.x here (it only reads the document; it does not import the app): this bench
uses its strategies and sends the requests itself, because its runner would read the event stream to its
never-coming end and its checks know nothing of the relay's error codes or its model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runtime.protocol import Done, Job, work_answer_from_json
from server.bench.fuzz_relay import ADMIN, LOOPBACK, relay_process

WRONG_AUTH_SHARE = 0.1  # requests sent with a wrong token or none
MUTATED_RESULT_SHARE = 0.5  # result uploads whose body is a mutated real result instead of Schemathesis' bytes
LEASED_QUERY_SHARE = 0.7  # of those, the share sent for (round, slot) of the fuzzer's latest assignment
STREAM_READ_SECONDS = 0.5  # how long an event stream is read before it is closed
MODEL_PATH = "/api/admin/export/model"
CHECKS = {"undocumented_code": "4xx with a code the document lists for the operation",
          "refusal_not_json": "4xx answered as JSON", "refusal_without_code": "4xx with an error code",
          "undocumented_status": "statuses the document lists",
          "transport": "every request answered (no timeout, no dropped connection)"}


@dataclass
class Finding:
    """A failed check: what was sent, what came back."""

    check: str
    operation: str
    status: int | None
    detail: str
    request: str


@dataclass
class Tally:
    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    by_mode: Counter[str] = field(default_factory=Counter)
    error_codes: Counter[str] = field(default_factory=Counter)
    codes_by_operation: Counter[str] = field(default_factory=Counter)
    checksum_checks: int = 0
    checksum_rebaselines: int = 0
    rejoins: int = 0
    restarts: int = 0  # new sessions after the fuzzing stopped or finished one
    results_accepted: int = 0
    merges_without_a_new_result: int = 0  # rounds merged after their last slot was refused to everyone
    findings: list[Finding] = field(default_factory=list)


# ---------------------------------------------------------------- the fuzzer


def model_checksum(exported: bytes) -> str:
    """sha256 of an exported model's weights and metadata. Not of the file's bytes: safetensors writes its
    header's keys in hash-map order, so one model exported twice gives two different files."""
    from server.session.export import exported_weights, metadata_of

    metadata = json.dumps(metadata_of(exported), sort_keys=True).encode()
    return hashlib.sha256(metadata + exported_weights(exported).astype("<f4").tobytes()).hexdigest()


class Fuzzer:
    """Sends generated requests to one relay and checks each answer against the document."""

    def __init__(self, url: str, *, seed: int, request_timeout: float, checksum_every: int) -> None:
        import requests

        from server.relay.openapi import documented_codes

        if urlsplit(url).hostname != LOOPBACK:
            raise ValueError(f"the fuzzer only targets {LOOPBACK}, not {url}")
        self.url, self.request_timeout, self.checksum_every = url, request_timeout, checksum_every
        self.http = requests.Session()  # the fuzz requests
        self.control = requests.Session()  # joins and checksums, on their own connections
        self.random = random.Random(seed)
        self.document = self.control.get(f"{url}/api/openapi.json", timeout=request_timeout).json()
        self.codes = documented_codes(self.document)
        self.statuses = {(method.upper(), path): {int(s) for s in entry["responses"]}
                         for path, item in self.document["paths"].items() for method, entry in item.items()}
        self.security = {(method.upper(), path): entry.get("security", [])
                         for path, item in self.document["paths"].items() for method, entry in item.items()}
        self.tally = Tally()
        self.peer_header = self.join()
        self.baseline = self.checksum()
        self.merged = 0  # rounds the session had merged when the baseline was taken
        self._history: list[dict[str, Any]] = []
        self.assignment: Job | None = None  # the latest one a fuzz request was answered with

    # -- helpers of the fuzzer's own (not counted) -------------------------------------------------
    def join(self) -> str:
        """A peer of the fuzzer's own: its Authorization header."""
        for _ in range(50):
            answer = self.control.post(f"{self.url}/api/join", json={}, timeout=self.request_timeout)
            if answer.status_code == 200:
                joined = answer.json()
                return f"Bearer {joined['peer_id']}:{joined['token']}"
            if answer.status_code != 429:
                raise RuntimeError(f"the fuzzer could not join: {answer.status_code} {answer.text}")
            time.sleep(min(float(answer.headers.get("retry-after", 1)), 2.0))
        raise RuntimeError("the fuzzer could not join: refused with 429 fifty times")

    def new_session(self) -> None:
        """A new session in place of one the fuzzing stopped (not counted), joined again, a new baseline."""
        answer = self.control.post(f"{self.url}/api/admin/session", json={"replace": True},
                                   headers={"Authorization": f"Bearer {ADMIN}"}, timeout=self.request_timeout)
        if answer.status_code != 200:
            raise RuntimeError(f"a new session was refused: {answer.status_code} {answer.text[:300]}")
        self.tally.restarts += 1
        self.peer_header, self.assignment = self.join(), None
        self.baseline, self.merged = self.checksum(), 0

    def settle(self) -> None:
        """Until no merge is under way: two looks at the status, 50 ms apart, that agree and show none."""
        seen = None
        for _ in range(200):
            status = self.control.get(f"{self.url}/api/session", timeout=self.request_timeout).json()
            now = (status["merging"], status["round"], json.dumps(status.get("round_progress"), sort_keys=True))
            if not now[0] and now == seen:
                return
            seen = now
            time.sleep(0.05)
        raise RuntimeError("the relay kept merging for 10 s after an accepted result")

    def merges(self) -> tuple[int, int]:
        """(rounds the session merged, results it accepted), from its status."""
        status = self.control.get(f"{self.url}/api/session", timeout=self.request_timeout).json()
        self._history = status["history"]
        return len(status["history"]), int(status["counters"].get("results_accepted", 0))

    def merged_results(self) -> int:
        """Results merged in all (the history read by the last ``merges``)."""
        return sum(int(entry["participants"]) for entry in self._history)

    def checksum(self) -> str:
        answer = self.control.get(self.url + MODEL_PATH, headers={"Authorization": f"Bearer {ADMIN}"},
                                  timeout=self.request_timeout)
        if answer.status_code != 200:
            raise RuntimeError(f"the model export answered {answer.status_code}: {answer.text[:200]}")
        self.tally.checksum_checks += 1
        return model_checksum(answer.content)

    def authorization(self, key: tuple[str, str]) -> str | None:
        security = self.security[key]
        if self.random.random() < WRONG_AUTH_SHARE:
            return self.random.choice([None, "Bearer nobody:nothing", f"Bearer {ADMIN}x", "Basic Zm9vOmJhcg==",
                                       self.peer_header + "x"])
        names = {name for requirement in security for name in requirement}
        if "admin" in names:
            return f"Bearer {ADMIN}"
        if "peer" in names:
            return self.peer_header
        return None

    # -- one request ---------------------------------------------------------------------------------
    def send(self, case: Any, mode: str) -> None:
        import requests

        key = (case.method.upper(), case.operation.path)
        label = f"{key[0]} {key[1]}"
        kwargs = case.as_transport_kwargs(base_url=self.url)
        headers = dict(kwargs.pop("headers", None) or {})
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        auth = self.authorization(key)
        if auth is not None:
            headers["Authorization"] = auth
        kwargs.pop("cookies", None)
        if key == ("POST", "/api/result") and self.random.random() < MUTATED_RESULT_SHARE:
            mode = self.mutated_result(kwargs, headers)
        if urlsplit(kwargs["url"]).hostname != LOOPBACK:
            raise RuntimeError(f"a generated request left {LOOPBACK}: {kwargs['url']}")
        described = f"{kwargs['method']} {kwargs['url']} params={kwargs.get('params')!r:.120}"
        self.tally.requests += 1
        self.tally.by_operation[label] += 1
        self.tally.by_mode[mode] += 1
        try:
            with self.http.request(**kwargs, headers=headers, timeout=self.request_timeout, stream=True,
                                   allow_redirects=False) as answer:
                body = self.read(answer)
                status, content_type = answer.status_code, answer.headers.get("content-type", "")
        except requests.RequestException as error:
            self.tally.by_status[0] += 1
            self.fail("transport", label, None, f"{type(error).__name__}: {error}", described)
            self.http.close()
            self.http = requests.Session()
            return
        self.tally.by_status[status] += 1
        self.check(key, label, status, content_type, body, described)
        if key == ("POST", "/api/work") and status == 200 and b'"slot"' in body:
            self.assignment = Job.from_json(body)
        if mode == "mutated-result" and status in (200, 403, 409):
            self.assignment = None  # used up, or not (or no longer) the peer's: the next one asks for work
        if status == 200 and key == ("POST", "/api/admin/{action}") and kwargs["url"].endswith("/stop"):
            self.new_session()  # the session ended: start another, so that the fuzzing meets a live one
        if status == 200 and key in (("POST", "/api/result"), ("POST", "/api/admin/session")):
            self.tally.checksum_rebaselines += 1
            if key[1] == "/api/result":
                self.tally.results_accepted += 1
                self.settle()  # the result may have completed its round: the merge changes the model
            self.baseline = self.checksum()  # a valid result, or a new session: the model may change
            self.merged = self.merges()[0]
            if key[1] == "/api/admin/session":
                self.peer_header = self.join()  # the old tokens lived in the old session's SQLite file
                self.tally.rejoins += 1
                self.assignment = None
        elif key[0] not in ("GET", "HEAD") or self.tally.requests % self.checksum_every == 0:
            now = self.checksum()
            if now != self.baseline:
                self.settle()
                merged, accepted = self.merges()
                if merged > self.merged and self.merged_results() <= accepted:
                    # A round merged without a new accepted result: its last slot was refused to every connected
                    # peer (docs/liveness.md), so it merged the results it had, each of them accepted earlier.
                    self.tally.merges_without_a_new_result += 1
                    self.baseline, self.merged = self.checksum(), merged
                else:
                    self.fail("checksum", label, status, f"the model changed: {self.baseline[:12]} -> {now[:12]} "
                              f"({merged - self.merged} rounds merged, {accepted} results accepted)", described)
                    self.baseline, self.merged = now, merged

    def mutated_result(self, kwargs: dict[str, Any], headers: dict[str, str]) -> str:
        """Replace a result upload's body with a real result message (the round's weights, one example), flipped,
        cut or grown in a few places or not at all, so that the checks behind the wire framing are reached;
        mostly for the (round, slot) the fuzzer's peer holds (it asks for work first when it holds none). Returns
        the request's mode for the tally."""
        from runtime import wire

        for _ in range(2):  # ask for a lease of the fuzzer's own (not counted)
            if self.assignment is not None:
                break
            answer = self.control.post(f"{self.url}/api/work", headers={"Authorization": self.peer_header},
                                       timeout=self.request_timeout)
            work = work_answer_from_json(answer.content) if answer.status_code == 200 else None
            if isinstance(work, Job):
                self.assignment = work
            elif isinstance(work, Done):
                self.new_session()  # every round merged: a new session, so that results keep mattering
        job = self.assignment if self.random.random() < LEASED_QUERY_SHARE else None
        if job is not None:
            kwargs["params"] = {"round": job.round, "slot": job.slot}
        query = f"?round={job.weights_round}" if job is not None else ""
        answer = self.control.get(f"{self.url}/api/weights{query}", headers={"Authorization": self.peer_header},
                                  timeout=self.request_timeout)
        if answer.status_code != 200:
            return "mutated-result"
        header, vector = wire.decode(answer.content)
        round_index = job.round if job is not None else header.round
        header = wire.WireHeader(spec=header.spec, round=round_index, fingerprint=header.fingerprint,
                                 num_examples=self.random.choice([1, 64, 256, 10**6]), metrics={"loss": 0.5})
        message = bytearray(wire.encode(vector, header))
        for _ in range(self.random.choice([0, 0, 1, 1, 2, 3])):
            at = self.random.randrange(len(message))
            kind = self.random.choice(["flip", "flip", "insert", "delete", "truncate"])
            if kind == "flip":
                message[at] ^= 1 << self.random.randrange(8)
            elif kind == "insert":
                message[at:at] = self.random.randbytes(self.random.randint(1, 8))
            elif kind == "delete":
                del message[at:at + self.random.randint(1, 8)]
            else:
                del message[at:]
        for name in ("json", "files"):
            kwargs.pop(name, None)
        kwargs["data"] = wire.reseal(bytes(message)) if self.random.random() < 0.5 else bytes(message)
        headers["Content-Type"] = "application/octet-stream"
        return "mutated-result"

    def read(self, answer: Any) -> bytes:
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            chunks, until = [], time.monotonic() + STREAM_READ_SECONDS
            for chunk in answer.iter_content(chunk_size=None):
                chunks.append(chunk)
                if b"\n\n" in b"".join(chunks) or time.monotonic() > until:
                    break
            return b"".join(chunks)  # (closing the stream drops the connection; the session opens another)
        return bytes(answer.content)

    def check(self, key: tuple[str, str], label: str, status: int, content_type: str, body: bytes,
              described: str) -> None:
        if status >= 500:
            self.fail("5xx", label, status, body[:300].decode("utf-8", "replace"), described)
            return
        if status not in self.statuses[key]:
            self.fail("undocumented_status", label, status, body[:200].decode("utf-8", "replace"), described)
        if not 400 <= status < 500:
            return
        if not content_type.startswith("application/json"):
            self.fail("refusal_not_json", label, status, f"content-type {content_type!r}", described)
            return
        if key[0] == "HEAD":
            return  # (no body to read the code from)
        try:
            code = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            self.fail("refusal_without_code", label, status, body[:200].decode("utf-8", "replace"), described)
            return
        self.tally.error_codes[f"{status} {code}"] += 1
        self.tally.codes_by_operation[f"{label} {status} {code}"] += 1
        if code not in self.codes.get(key, {}).get(status, set()):
            self.fail("undocumented_code", label, status, f"error {code!r}", described)

    def fail(self, check: str, label: str, status: int | None, detail: str, described: str) -> None:
        finding = Finding(check, label, status, detail, described)
        self.tally.findings.append(finding)
        print(f"  FAIL [{check}] {label} -> {status}: {detail} ({described})", flush=True)

    # -- the campaign ----------------------------------------------------------------------------------
    def run(self, requests: int, seconds: float, batch: int, *, log_every: int = 500) -> Tally:
        import schemathesis
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis.errors import HypothesisException

        schema = schemathesis.openapi.from_dict(self.document)
        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
        modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
        end = time.monotonic() + seconds
        next_log = log_every
        unsatisfiable: set[str] = set()
        while self.tally.requests < requests and time.monotonic() < end:
            before = self.tally.requests
            for operation in operations:
                for mode in modes:
                    label = f"{operation.method.upper()} {operation.path} {mode.value}"
                    left = requests - self.tally.requests
                    if left <= 0 or time.monotonic() >= end or label in unsatisfiable:
                        continue

                    @settings(max_examples=min(batch, left), database=None, deadline=None, derandomize=False,
                              phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                              verbosity=Verbosity.quiet)
                    @given(case=operation.as_strategy(generation_mode=mode))
                    def one(case: Any) -> None:
                        if self.tally.requests < requests and time.monotonic() < end:
                            self.send(case, case.meta.generation.mode.value if case.meta else "?")

                    try:
                        one()
                    except HypothesisException as error:  # e.g. nothing negative to make of a parameterless GET
                        unsatisfiable.add(label)
                        print(f"  ({label}: no more cases: {type(error).__name__})", flush=True)
                    while self.tally.requests >= next_log:
                        fivexx = sum(count for status, count in self.tally.by_status.items() if status >= 500)
                        print(f"  {self.tally.requests} requests, {fivexx} 5xx, {len(self.tally.findings)} failed "
                              "checks", flush=True)
                        next_log += log_every
            if self.tally.requests == before:
                break  # every operation exhausted its cases
        if self.tally.requests:
            now = self.checksum()
            if now != self.baseline:
                self.fail("checksum", "(end)", None, f"the model changed: {self.baseline[:12]} -> {now[:12]}", "")
        return self.tally


# ---------------------------------------------------------------- the bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=10000, help="fuzz requests to send (default 10000)")
    parser.add_argument("--seconds", type=float, default=1800.0, help="stop after this long (default 1800)")
    parser.add_argument("--batch", type=int, default=25, help="requests per operation and mode in a turn")
    parser.add_argument("--seed", type=int, default=0, help="seed of the auth choices (Hypothesis draws its own)")
    parser.add_argument("--request-timeout", type=float, default=10.0, help="seconds before a request fails")
    parser.add_argument("--checksum-every", type=int, default=10,
                        help="also check the model after every N-th GET or HEAD (always after any other method)")
    parser.add_argument("--work-dir", type=Path, help="the relay's session and log (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/fuzz.json"), help="figures as JSON")


def summarize(tally: Tally, elapsed: float) -> dict[str, Any]:
    counts = {name: value for name, value in asdict(tally).items() if isinstance(value, int)}
    return counts | {
        "seconds": round(elapsed, 1), "5xx": sum(n for status, n in tally.by_status.items() if status >= 500),
        "by_status": {str(status): count for status, count in sorted(tally.by_status.items())},
        "by_mode": dict(tally.by_mode), "by_operation": dict(sorted(tally.by_operation.items())),
        "error_codes": dict(sorted(tally.error_codes.items())),
        "codes_by_operation": dict(sorted(tally.codes_by_operation.items())),
        "failed_checks": Counter(f.check for f in tally.findings),
        "findings": [asdict(f) for f in tally.findings[:200]],
    }


def report(summary: dict[str, Any]) -> None:
    print(f"requests: {summary['requests']} in {summary['seconds']} s "
          f"({', '.join(f'{k} {v}' for k, v in summary['by_mode'].items())})")
    print("by status: " + ", ".join(f"{status}: {count}" for status, count in summary["by_status"].items())
          + "   (0: no answer)" * ("0" in summary["by_status"]))
    print("by operation:")
    for label, count in summary["by_operation"].items():
        print(f"  {count:6d}  {label}")
    print("refusal codes seen: " + ", ".join(f"{code} x{count}" for code, count in summary["error_codes"].items()))
    failed = summary["failed_checks"]
    print(f"check 5xx: {summary['5xx']} (anchor: 0)  {'ok' if not summary['5xx'] else 'FAILED'}")
    for check, text in CHECKS.items():
        print(f"check {text}: {failed.get(check, 0)} failures (anchor: 0)  {'FAILED' if failed.get(check) else 'ok'}")
    print(f"check model checksum unchanged by anything but a valid result: {summary['checksum_checks']} checks, "
          f"{failed.get('checksum', 0)} changes (anchor: 0), {summary['checksum_rebaselines']} new baselines after "
          f"accepted results ({summary['results_accepted']}) or new sessions, "
          f"{summary['merges_without_a_new_result']} rounds merged with a slot refused to every peer  "
          f"{'ok' if not failed.get('checksum') else 'FAILED'}")


def run(args: argparse.Namespace) -> int:
    from server.relay.app import RelayPaths

    for problem in RelayPaths().missing():  # (serve refuses to start without them)
        print(f"peertrain bench fuzz: {problem}", file=sys.stderr)
    if RelayPaths().missing():
        return 2
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="peertrain-fuzz-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"starting a relay on {LOOPBACK} (session and log in {work_dir})", flush=True)
    started = time.monotonic()
    try:
        with relay_process(work_dir) as url:
            print(f"relay at {url}; fuzzing up to {args.requests} requests or {args.seconds:g} s", flush=True)
            fuzzer = Fuzzer(url, seed=args.seed, request_timeout=args.request_timeout,
                            checksum_every=args.checksum_every)
            tally = fuzzer.run(args.requests, args.seconds, args.batch)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    summary = summarize(tally, time.monotonic() - started)
    report(summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"figures written to {args.out}")
    return 1 if tally.findings else 0
