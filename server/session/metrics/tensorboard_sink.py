"""A session's run as TensorBoard event files, through tensorboardX (TensorBoard's format without TensorFlow).

One run per session: the folder ``DIR/NAME``. Every opening of the run writes a new event file whose first event is a
restart at the step it starts from (TensorBoard's ``purge_step``): TensorBoard's readers then drop the points a
previous writer left at that step and later (a round written before a crash moved the resume marker, a session
created again in the same folder) and show what follows. A ban's undo writes the same marker at the first undone
round (``undo``). Event files are named by the second they were opened in, then by a sequence number here, so two
openings within a second still sort in the order they were written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from server.session.metrics import entries

SETTINGS_TAG = "settings"
FLUSH_SECONDS = 5  # how often tensorboardX's writer thread flushes its file: TensorBoard sees a round within that


class TensorBoardSink:
    """``run_dir``: this session's run folder (``DIR/NAME``)."""

    kind = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir).resolve()
        self._writer: Any = None

    def open(self, saved: Mapping[str, Any] | None, settings: Mapping[str, str]) -> bool:
        """Open the run: the one ``saved`` names when it is this folder (True), else a new one (its settings
        written first). ``saved["rounds"]`` (the rounds the run holds) is where the new event file starts."""
        from tensorboardX import SummaryWriter

        continued = saved is not None and saved.get("run_dir") == str(self.run_dir)
        start = int(saved["rounds"]) if continued and saved is not None else 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        sequence = sum(1 for _ in self.run_dir.glob("events.out.tfevents.*"))
        self._writer = SummaryWriter(str(self.run_dir), purge_step=start, flush_secs=FLUSH_SECONDS,
                                     filename_suffix=f".{sequence:04d}")
        if not continued:
            self._writer.add_text(SETTINGS_TAG, entries.settings_table(settings), 0)
            self._writer.flush()
        return continued

    def state(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir)}

    def write(self, entry: Mapping[str, Any]) -> None:
        step, wall_time = entries.step(entry), entries.wall_time(entry)
        for key, value in entries.scalars(entry).items():
            self._writer.add_scalar(key, value, step, walltime=wall_time)
        self._writer.flush()

    def undo(self, step: int, rounds: int) -> None:
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self._writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
        self._writer.add_scalar(entries.UNDONE, float(rounds), step)
        self._writer.flush()

    def end(self, *, finished: bool, stopped: str | None) -> None:
        """TensorBoard has no run status: the file is flushed (and closed when the run is left, ``close``)."""
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
