"""Each round's metrics where ML people look: TensorBoard event files and MLflow runs, written by the host.

``serve`` and ``simulate`` take ``--tensorboard DIR`` and ``--mlflow [URI]`` (``server.cli.options``). A session
given a ``MetricsLog`` (``Session.create(..., round_log=log)``, ``Session.restore``) hands it its history after every
checkpoint; the log mirrors it into each sink on a thread of its own, so a slow or unreachable tracking server never
holds a merge. ``history.jsonl`` stays the record: a sink that fails logs a warning, the session goes on, and the
sink catches up at the next round.

What a round gives (``entries.scalars``): every number of its history entry at step = the entry's ``round``, nested
keys joined by ``/`` (``metrics/val_loss``, ``diagnostics/spread``, ``seconds/merge``, ``train/train_loss``...),
at the round's own wall time. The session's settings (``session.json``: its config, task, plan) go once per run:
MLflow params (truncated to MLflow's limits), a TensorBoard text summary. One run per session, named after the
session's folder: TensorBoard's in ``DIR/NAME``, MLflow's in the experiment ``peertrain TASK``, FINISHED when the
session ends (done or stopped), KILLED when its process stops before (a resumed session sets it RUNNING again).

Resuming: ``metrics_log.json`` in the session folder says which run each sink writes to and how many of the
history's rounds it holds (and their times, so a history rewritten meanwhile is told apart). A resumed session
continues the same MLflow run and writes only the rounds its sinks lack; a TensorBoard writer opened again marks
the step it starts from as a restart (TensorBoard's ``purge_step``), so a round written twice shows once. A new
session in the same folder (``POST /api/admin/session``, ``simulate`` into the same ``--out``) is a new MLflow run;
in TensorBoard it takes the run's folder over from step 0 (the points before it stay in their files, unshown).

Undone rounds (a ban's undo merges rounds again, ``server.relay.undo``): neither tool can delete a point. The log
writes ``undone`` = the number of rounds set aside, at the first of them, then the rounds as merged again. In
TensorBoard a restart marker at that step goes first, so its readers drop the undone rounds' points and show the
new ones; MLflow keeps both, the new values the later ones at each step.
"""

from __future__ import annotations

from server.session.metrics.log import MetricsLog
from server.session.metrics.round_log import NO_ROUND_LOG, RoundLog
from server.session.metrics.targets import LOCAL_STORE, MetricsError, MetricsTargets

__all__ = ["LOCAL_STORE", "NO_ROUND_LOG", "MetricsError", "MetricsLog", "MetricsTargets", "RoundLog"]
