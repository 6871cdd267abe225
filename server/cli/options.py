"""Options and helpers that several commands share: the task and its settings, the merge choices, BLAS threads."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.relay.options import ServerLimits
    from server.session.metrics import MetricsTargets


def merge_names() -> list[str]:
    """The merge methods a command offers: every one the runtime registers (``runtime.merge.MERGES``)."""
    from runtime.merge import MERGES  # (imports numpy: not before ``single_threaded_blas`` had its say)

    return list(MERGES)


def add_config_option(parser: argparse.ArgumentParser, command: str) -> None:
    """``--config FILE``: the settings of a session in a TOML file (docs/sessions/settings.md); flags override it."""
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help=f"a TOML file of settings, keyed by their names (merge = \"fedavgm\", participants = 4, "
                        f"[merge_config] ...; examples/session.toml); a flag given here overrides the file; an "
                        f"unknown key or a bad value is refused (the settings: {command} --help, "
                        f"docs/sessions/settings.md)")


def add_buffer_option(parser: Any) -> None:
    """``--buffer K``: async mode's results per merge, another name for -k there."""
    parser.add_argument("--buffer", type=positive_int, metavar="K",
                        help="async: results per merge (default: -k); only with --mode async")


def read_settings(args: argparse.Namespace, command: str, *, file_also: Sequence[str] = (),
                  environ: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments of ``SessionConfig`` and ``RelayOptions`` that ``command``'s flags, the environment
    and its ``--config`` file give (in that order of precedence; the rest are the declared defaults), each value
    checked (``server.session.settings``); ``--buffer`` becomes k in async mode. ``file_also``: session
    settings the file may hold though the command has no flag for them. A ``SettingError`` names a bad one."""
    from server.relay.options import RelayOptions
    from server.session.config import SessionConfig
    from server.session.settings import SettingError, combine, explicit

    from_file = config_file(args, command, file_also=file_also)
    environ = os.environ if environ is None else environ
    session = combine(SessionConfig, command, explicit(SessionConfig, args), from_file, environ)
    session.update({name: from_file[name] for name in file_also if name in from_file})
    relay = combine(RelayOptions, command, explicit(RelayOptions, args), from_file, environ)
    if args.buffer is not None:
        if session.get("mode", "sync") != "async":
            raise SettingError("buffer", "is async mode's results per merge: only with --mode async", name="--buffer")
        session["participants"] = args.buffer
    return session, relay


def config_file(args: argparse.Namespace, command: str, *, file_also: Sequence[str] = ()) -> dict[str, Any]:
    """The settings in ``command``'s ``--config`` file (none without one), each checked: those of ``SessionConfig``,
    ``RelayOptions`` and ``ServerLimits`` the command takes, and ``file_also``'s session settings."""
    from server.relay.options import RelayOptions, ServerLimits
    from server.session.config import SessionConfig
    from server.session.settings import declared, read_file

    if not args.config:
        return {}
    classes = (SessionConfig, RelayOptions, ServerLimits)
    accepted = {name: item for cls in classes for name, item in declared(cls, command).items()}
    accepted.update({name: declared(SessionConfig)[name] for name in file_also})
    every = {name for cls in classes for name in declared(cls)}
    return read_file(args.config, accepted, command=command, elsewhere=every)


def read_limits(args: argparse.Namespace) -> ServerLimits:
    """``serve``'s connection limits (``server.relay.options.ServerLimits``): a flag, else the ``--config`` file,
    else the declared default. A ``SettingError`` names a bad one."""
    from server.relay.options import ServerLimits
    from server.session.settings import combine, explicit

    values = combine(ServerLimits, "serve", explicit(ServerLimits, args), config_file(args, "serve"), os.environ)
    return ServerLimits(**values)


def add_metrics_options(parser: argparse.ArgumentParser, output: str) -> None:
    """``--tensorboard DIR`` and ``--mlflow [URI]``: each round's metrics where ML people look
    (``server.session.metrics``); ``output`` names the folder the local MLflow store goes in. Read them back with
    ``metrics_log(args, folder)``."""
    from server.session.metrics import LOCAL_STORE

    parser.add_argument("--tensorboard", type=Path, metavar="DIR",
                        help="also write each round's metrics (every number of its history entry: the validation "
                        "metrics, the merge's diagnostics, the timings) and the session's settings as TensorBoard "
                        "event files, one run per session in DIR/NAME (NAME: the session's folder); see them with "
                        "`tensorboard --logdir DIR`; a resumed session writes on in its run")
    parser.add_argument("--mlflow", nargs="?", const=LOCAL_STORE, metavar="URI",
                        help="also log them to MLflow: one run per session, named after its folder, in the experiment "
                        "\"peertrain TASK\", the settings as its params, FINISHED when the session ends; URI: a "
                        "tracking server (http://HOST:5000) or store (sqlite:///PATH/mlflow.db); without one, a SQLite "
                        f"store in {output}/mlflow.db (MLflow's recommended local store)")


def metrics_targets(args: argparse.Namespace, output: Path) -> MetricsTargets | None:
    """Where ``--tensorboard`` and ``--mlflow`` ask each session's rounds to go (the local MLflow store in ``output``),
    checked: a ``MetricsError`` (a ValueError) says what cannot be written or reached. None without either option;
    ``targets.log()`` is the sessions' ``round_log``."""
    from server.session.metrics import MetricsTargets

    targets = MetricsTargets.of(args.tensorboard, args.mlflow, output=output)
    if not targets:
        return None
    targets.check()
    return targets


def add_sweep_options(parser: argparse.ArgumentParser) -> None:
    """``--workers N`` and ``--ray [ADDRESS]``: where a command's sessions run (``server.simulation.sweep``); read them
    back with ``sweep_settings(args)`` and pass them to ``simulator.compare`` (or ``sweep.run_sessions``)."""
    group = parser.add_argument_group("parallel sessions (the results are the same bits on every engine)")
    group.add_argument("--workers", type=positive_int, metavar="N",
                       help="sessions at once: processes of a local pool (default: one per CPU; 1: in this process, "
                       "one after another), with --ray the CPUs of the local Ray instance or the sessions in flight "
                       "on a cluster")
    group.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="run the sessions as Ray tasks: alone, on a Ray instance started for this run; with an "
                       "ADDRESS (HEAD:6379, as `ray start --head` prints it, or auto: the cluster this machine is "
                       "part of), on that cluster's machines; the outputs are written here either way")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def sweep_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``simulator.compare`` that ``add_sweep_options`` asked for: ``engine``, ``workers``,
    ``ray_address``."""
    ray = getattr(args, "ray", None)
    return {"engine": "pool" if ray is None else "ray", "workers": getattr(args, "workers", None),
            "ray_address": None if ray in (None, "local") else ray}


def parse_sets(pairs: Sequence[str]) -> dict[str, object]:
    """``--set key=value`` pairs; values are read as JSON when they parse (numbers, lists), else as text."""
    settings: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        try:
            settings[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            settings[key.strip()] = raw
    return settings


def add_task_options(parser: argparse.ArgumentParser, *, seed: bool = True) -> None:
    """Options shared by every command that builds a task: which task, its settings, the seed (``seed=False``:
    the command has the session's own ``--seed``, ``SessionConfig.seed``)."""
    parser.add_argument("--task", default="arith",
                        help="built-in task (bytetext, bytetext-local, arith, cartpole), a file path.py, or "
                        "package.module[:Class]")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a task setting, repeatable (e.g. --set tokenizer=char --set chunks=5)")
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="seed for initial weights and the unit order")


def single_threaded_blas() -> None:
    """One BLAS thread in this process, unless the user chose otherwise (``OPENBLAS_NUM_THREADS``).

    The simulator trains many small units one after another (as a browser does, single-threaded); on a
    busy 2-core host, OpenBLAS's spinning worker threads made a unit 10-15x slower, for the same bits. The relay
    reads each result in its own worker threads (decode, norm, its part of the sum), so BLAS threads on top only
    oversubscribe the cores: in ``bench crowd``'s async setting the relay spent 38-45 ms of CPU per result with
    OpenBLAS's default threads and 19 ms with one (a float64 norm of a result, 0.05 ms of CPU on one thread, took
    2.4 ms on two while the host was busy).
    It only takes effect before numpy is first imported: ``server.cli`` calls it before importing the commands,
    for the commands of ``ONE_BLAS_THREAD``.
    """
    if "numpy" not in sys.modules:
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            os.environ.setdefault(name, "1")


# command words whose runs do many small numpy steps, one after another or in threads of their own: training unit
# after unit, or a relay reading results as they come
ONE_BLAS_THREAD = (("simulate",), ("bench", "merges"), ("bench", "stragglers"), ("serve",), ("verify-worker",))


def wants_one_blas_thread(argv: Sequence[str]) -> bool:
    return any(tuple(argv[:len(words)]) == words for words in ONE_BLAS_THREAD)
