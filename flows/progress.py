"""Progress of a training job, followed from the process that waits on it: step/total, samples/s,
tokens/s (when the task counts tokens) and the time left, in the terminal (a bar on a tty, a line
otherwise) and in the Prefect UI as the progress artifact ``training-progress``.

It reads what rank 0 already writes (``core.metrics_file``): the params record gives the steps an
epoch takes and the global batch; each ``perf/*`` window (every ``training.log_every_steps``) and
each epoch's record give the step reached and the throughput. The artifact is updated the first
time training is seen to move, then at most every ``interval_s``, and once at the end (100 % when
the job completed). Following never fails training: a Prefect error is a warning.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core.metrics_file import file_size, read_records

log = logging.getLogger(__name__)

ARTIFACT_KEY = "training-progress"


@dataclass
class Point:
    """Where training is: ``step`` of ``total`` (None until the params are read), throughput."""

    step: int = 0
    total: int | None = None
    global_batch: int | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None

    @property
    def percent(self) -> float:
        if not self.total:
            return 0.0
        return round(min(100.0, 100.0 * self.step / self.total), 1)

    @property
    def eta_s(self) -> float | None:
        if not self.total or not self.samples_per_s or not self.global_batch:
            return None
        return max(0.0, (self.total - self.step) * self.global_batch / self.samples_per_s)

    def text(self) -> str:
        parts = [f"step {self.step}/{self.total if self.total else '?'} ({self.percent:.0f}%)"]
        if self.samples_per_s:
            parts.append(f"{self.samples_per_s:,.0f} samples/s")
        if self.tokens_per_s:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if (eta := self.eta_s) is not None:
            parts.append(f"ETA {_duration(eta)}")
        return ", ".join(parts)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    return f"{minutes}m{s:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def advance(point: Point, record: dict, epochs: int) -> bool:
    """Fold one metrics-file record into ``point``; True when it moved training's step or throughput."""
    params = record.get("params")
    if isinstance(params, dict):
        for key, value in params.items():
            try:  # a resized run logs them again as ``resized_at_step_N.train.<name>``
                if key.endswith("steps_per_epoch"):
                    point.total = int(value) * epochs
                elif key.endswith("global_batch"):
                    point.global_batch = int(value)
            except (TypeError, ValueError):
                continue
        return False
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        return False
    try:
        step = int(record.get("step", 0))
    except (TypeError, ValueError):
        return False
    if "perf/samples_per_s" in metrics:  # a window of steps: its step is the global step
        point.step = max(point.step, step)
        point.samples_per_s = float(metrics["perf/samples_per_s"])
        point.tokens_per_s = float(metrics["perf/tokens_per_s"]) if "perf/tokens_per_s" in metrics else None
        return True
    if "train/train_loss" in metrics and point.total:  # an epoch's end: its step is the epoch number
        point.step = max(point.step, step * point.total // epochs)
        if "train/samples_per_s" in metrics:
            point.samples_per_s = float(metrics["train/samples_per_s"])
        return True
    return False


class ProgressFollower:
    """Tails the metrics file from ``offset`` into a terminal display and a Prefect progress artifact."""

    def __init__(self, path: Path, epochs: int, offset: int, logger, artifact: bool, bar: bool, description: str):
        self.path, self.epochs, self.offset = Path(path), max(1, int(epochs)), offset
        self.logger, self.artifact, self.description = logger, artifact, description
        self.point = Point()
        self.updates = 0
        self.artifact_id = None
        self._moved = self._shown = False
        self._last = 0.0
        self._bar = self._task = None
        if bar:
            from rich.progress import BarColumn, Progress, TextColumn

            self._bar = Progress(TextColumn("train"), BarColumn(), TextColumn("{task.description}"), transient=False)

    def start(self) -> None:
        if self.artifact:
            try:
                from prefect.artifacts import create_progress_artifact

                self.artifact_id = create_progress_artifact(0.0, key=ARTIFACT_KEY,
                                                            description=f"{self.description}: starting")
            except Exception as exc:  # noqa: BLE001 - the UI's progress must never stop training
                log.warning("could not create the Prefect progress artifact: %s", exc)
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task("starting", total=100)

    def poll(self, force: bool = False) -> None:
        """Read what is new; show it the first time training moves, then at most every interval."""
        records, self.offset = read_records(self.path, self.offset)
        for rec in records:
            self._moved |= advance(self.point, rec, self.epochs)
        if self._moved and (not self._shown or force):
            self._show(self.point.text())

    def finish(self, completed: bool) -> None:
        self.poll()
        if self.point.step and not self._shown:
            self._show(self.point.text())  # the first movement seen, before the end is said
        if completed and self.point.total:
            self.point.step = self.point.total
        state = "done" if completed else "stopped"
        self._show(f"{state}: {self.point.text()}", final=True)
        if self._bar is not None:
            self._bar.stop()

    def _show(self, text: str, final: bool = False) -> None:
        self._shown = True
        self._moved = False
        self._last = time.monotonic()
        if self._bar is not None:
            self._bar.update(self._task, completed=self.point.percent, description=text)
        else:
            self.logger.info("training progress: %s", text)
        if self.artifact_id is not None:
            try:
                from prefect.artifacts import update_progress_artifact

                update_progress_artifact(self.artifact_id, self.point.percent,
                                         description=f"{self.description}: {text}")
                self.updates += 1
            except Exception as exc:  # noqa: BLE001 - the UI's progress must never stop training
                log.warning("could not update the Prefect progress artifact: %s", exc)
        if final and self.artifact_id is not None:
            self.logger.info("training progress: %d update(s) of the Prefect artifact %s", self.updates, ARTIFACT_KEY)

    def due(self, interval_s: float) -> bool:
        return time.monotonic() - self._last >= interval_s


@contextmanager
def follow_progress(path: Path, epochs: int, logger, description: str, interval_s: float = 2.0,
                    artifact: bool = True, poll_s: float = 0.5) -> Iterator[ProgressFollower]:
    """Follow the metrics file ``path`` (from its size on entry) while the block runs; the caller says
    how it ended with ``follower.completed = True``. A bar when stderr is a terminal, else log lines
    through ``logger``; the Prefect artifact when ``artifact`` (inside a flow or task run)."""
    follower = ProgressFollower(path, epochs, file_size(path), logger, artifact, sys.stderr.isatty(), description)
    follower.completed = False
    follower.start()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(poll_s):
            try:
                follower.poll(force=follower.due(interval_s))
            except Exception as exc:  # noqa: BLE001 - following must never stop training
                log.warning("following training progress in %s: %s", path, exc)

    # The copied context carries Prefect's run context (the API client's settings) into the thread.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(loop,), name="trainflow-progress",
                              daemon=True)
    thread.start()
    try:
        yield follower
    finally:
        stop.set()
        thread.join()
        try:
            follower.finish(follower.completed)
        except Exception as exc:  # noqa: BLE001
            log.warning("following training progress in %s: %s", path, exc)
