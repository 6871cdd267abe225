"""Where a command's sessions log their metrics (``--tensorboard DIR``, ``--mlflow [URI]``), checked before anything
runs: a folder that cannot be written or a store that cannot be reached is a ``MetricsError`` at the start (the
commands exit 2 with its message), never a failure mid-session.

The local MLflow store (``--mlflow`` without a URI) is a SQLite file, ``mlflow.db`` in the command's output folder,
not MLflow's older ``./mlruns`` folder of files: MLflow 3 keeps that file store in maintenance mode and refuses it
unless ``MLFLOW_ALLOW_FILE_STORE=true``, and its own default tracking URI is ``sqlite:///mlflow.db``.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from server.session.metrics.log import MetricsLog, MetricsSink

LOCAL_STORE = "local"  # --mlflow without a URI: a SQLite store in the command's output folder
LOCAL_STORE_FILE = "mlflow.db"
INSTALL = "pip install -e '.[metrics]'"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class MetricsError(ValueError):
    """``--tensorboard`` or ``--mlflow`` cannot be used; the message says why."""


def local_store(folder: Path) -> str:
    """The tracking URI of the SQLite store in ``folder``."""
    return "sqlite:///" + (Path(folder).resolve() / LOCAL_STORE_FILE).as_posix()


@dataclass(frozen=True)
class MetricsTargets:
    """``tensorboard``: a folder holding one run per session (``DIR/NAME``); ``mlflow``: a tracking URI. Each
    session's run is named after its folder (NAME)."""

    tensorboard: Path | None = None
    mlflow: str | None = None

    @classmethod
    def of(cls, tensorboard: Path | None, mlflow: str | None, *, output: Path) -> MetricsTargets:
        """The targets the options name, ``--mlflow``'s local store in ``output``."""
        return cls(tensorboard=Path(tensorboard).resolve() if tensorboard is not None else None,
                   mlflow=local_store(output) if mlflow == LOCAL_STORE else mlflow)

    def __bool__(self) -> bool:
        return self.tensorboard is not None or self.mlflow is not None

    def check(self) -> None:
        """A ``MetricsError`` unless each target can be written (TensorBoard's folder) or reached (MLflow's store,
        created where it is a new SQLite file)."""
        if self.tensorboard is not None:
            check_folder(self.tensorboard)
        if self.mlflow is not None:
            check_tracking_uri(self.mlflow)

    def sinks(self, name: str) -> list[MetricsSink]:
        """A session's sinks: its run named ``name`` in each target."""
        from server.session.metrics.mlflow_sink import MLflowSink
        from server.session.metrics.tensorboard_sink import TensorBoardSink

        sinks: list[MetricsSink] = []
        if self.tensorboard is not None:
            sinks.append(TensorBoardSink(self.tensorboard / name))
        if self.mlflow is not None:
            sinks.append(MLflowSink(self.mlflow, name))
        return sinks

    def log(self) -> MetricsLog:
        """A log writing each session it is given to these targets (``check`` them first: a start-up error)."""
        return MetricsLog(self.sinks)


def check_folder(folder: Path) -> None:
    try:
        import tensorboardX  # noqa: F401
    except ImportError as error:
        raise MetricsError(f"--tensorboard needs tensorboardX ({INSTALL}): {error}") from None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".peertrain-probe-"):
            pass
    except OSError as error:
        raise MetricsError(f"--tensorboard {folder}: cannot write there: {error.strerror or error}") from None


def check_tracking_uri(uri: str) -> None:
    if not _SCHEME.match(uri):
        raise MetricsError(f"--mlflow {uri}: give a tracking URI (http://HOST:5000, sqlite:///PATH/mlflow.db), or no "
                           "value for a SQLite store in the output folder")
    if uri.startswith("sqlite:///"):  # (a new store's folder: made here, so a bad one is named as such)
        parent = Path(uri.removeprefix("sqlite:///")).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise MetricsError(f"--mlflow {uri}: cannot make {parent}: {error.strerror or error}") from None
        if not os.access(parent, os.W_OK):
            raise MetricsError(f"--mlflow {uri}: cannot write in {parent}")
    try:
        from server.session.metrics.mlflow_sink import client

        client(uri).search_experiments(max_results=1)
    except ImportError as error:
        raise MetricsError(f"--mlflow needs mlflow-skinny, SQLAlchemy and Alembic ({INSTALL}): {error}") from None
    except Exception as error:  # (MLflow's own words: a refused scheme, a server that does not answer)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise MetricsError(f"--mlflow {uri}: cannot reach the tracking store: {first}") from None
