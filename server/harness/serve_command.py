"""What a ``peertrain serve`` child is started with, typed: the session's settings (``SessionConfig``), the relay's
(``RelayOptions``) and its connection limits (``ServerLimits``), the task or the package, the session's folder, and
serve's own switches. ``arguments()`` is its command line, derived from the declarations
(``server.session.settings.arguments``: only what differs from serve's defaults), so a bench or a test builds
objects and never spells a setting's flag.

Flags rather than a ``--config`` file written for the child: they need no file beside the session, a caller's own
``--config`` still composes with them, and the command in a log says what the relay was given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.relay.options import RelayOptions, ServerLimits
from server.session.config import SessionConfig
from server.session.settings import arguments


@dataclass(frozen=True, kw_only=True)
class ServeCommand:
    """``peertrain serve``'s arguments as objects (docs/sessions/settings.md). None leaves serve's default: no
    ``config`` is serve's session defaults, no ``options`` its relay defaults; an admin token serve makes up and
    prints where none is given (no ``options``, or an empty ``admin_token``)."""

    task: str | None = None  # a built-in task, a file path.py or package.module[:Class] (serve's default: arith)
    task_settings: Mapping[str, Any] = field(default_factory=dict)  # the task's settings (serve's --set KEY=VALUE)
    package: Path | None = None  # a built package, instead of building the task's
    session_dir: Path | None = None
    store: str | None = None  # the store's location (serve --store: postgresql://...); None: SQLite in session_dir
    config: SessionConfig | None = None
    options: RelayOptions | None = None
    limits: ServerLimits | None = None  # None: serve's connection limits
    fresh: bool = False  # discard a session in session_dir
    no_session: bool = False  # the page and its assets only
    force_verify: bool = False
    port: int | None = None  # None: RelayProcess asks for a free one at the first start, the same one after
    peers: int | None = None  # headless Chromium peers serve also starts
    tls_cert: Path | None = None
    tls_key: Path | None = None
    config_file: Path | None = None  # a TOML file of settings (the objects' flags override it)
    tensorboard: Path | None = None  # each round's metrics as TensorBoard event files in this folder
    mlflow: str | None = None  # ... and in this MLflow tracking URI ("local": a SQLite store in the session folder)
    extra: Sequence[str] = ()  # serve's other arguments as typed: --host, --log-level

    def arguments(self) -> list[str]:
        """The command line (after ``serve``); ``RelayProcess`` puts ``--port 0`` before it: ``port`` overrides it."""
        said: list[str] = []
        for flag, value in (("--task", self.task), ("--package", self.package), ("--session-dir", self.session_dir),
                            ("--store", self.store),
                            ("--port", self.port), ("--peers", self.peers), ("--tls-cert", self.tls_cert),
                            ("--tls-key", self.tls_key), ("--config", self.config_file),
                            ("--tensorboard", self.tensorboard), ("--mlflow", self.mlflow)):
            if value is not None:
                said.append(f"{flag}={value}")
        said += [f"--set={key}={set_text(value)}" for key, value in self.task_settings.items()]
        said += [flag for flag, on in (("--fresh", self.fresh), ("--no-session", self.no_session),
                                       ("--force-verify", self.force_verify)) if on]
        for settings in (self.config, self.options, self.limits):
            if settings is not None:
                said += arguments(settings, "serve")
        return [*said, *self.extra]


def set_text(value: Any) -> str:
    """A task setting as ``--set`` reads it back (``server.cli.options.parse_sets``: JSON where the text parses,
    else the text): text that would parse as something else is quoted, everything else is JSON."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value
    return json.dumps(value)
