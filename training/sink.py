"""Where rank 0's metrics go: the pipeline's MLflow run (optional), a progress bar or log lines.

Other ranks get a sink that drops everything, so the loop never checks the rank.
The MLflow run is named by ``TRAINFLOW_MLFLOW_RUN_ID`` (set by the launcher);
without it, training runs with MLflow entirely unused.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import asdict

log = logging.getLogger("trainflow.train")

RUN_ID_ENV = "TRAINFLOW_MLFLOW_RUN_ID"


class MetricsSink:
    def __init__(self, enabled: bool, run_id: str | None = None, progress: bool | None = None):
        self.enabled = enabled
        self.run_id = run_id if enabled else None
        self._client = None
        self._bar = None
        self._task = None
        self.progress = enabled and (sys.stderr.isatty() if progress is None else progress)

    @classmethod
    def for_rank(cls, is_main: bool) -> "MetricsSink":
        return cls(enabled=is_main, run_id=os.environ.get(RUN_ID_ENV) or None)

    @property
    def client(self):
        if self._client is None and self.run_id:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient()
        return self._client

    def params(self, params: dict) -> None:
        if self.client:
            from mlflow.entities import Param

            self.client.log_batch(self.run_id, params=[Param(f"train.{k}", str(v)) for k, v in params.items()])
        if self.enabled:
            log.info("training: %s", ", ".join(f"{k}={v}" for k, v in params.items()))

    def metrics(self, values: dict, step: int) -> None:
        if self.client:
            import time

            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def start(self, total_epochs: int, done: int) -> None:
        if not self.progress:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total} epochs"),
                             TextColumn("{task.description}"), TimeElapsedColumn(), transient=False)
        self._bar.start()
        self._task = self._bar.add_task("", total=total_epochs, completed=done)

    def epoch(self, stats, step: int) -> None:
        if not self.enabled:
            return
        d = asdict(stats)
        epoch = d.pop("epoch")
        self.metrics({f"train/{k}": v for k, v in d.items()}, step=epoch)
        line = (f"epoch {epoch}: loss {stats.train_loss:.4f} val_loss {stats.val_loss:.4f} "
                f"val_acc {stats.val_accuracy:.4f} {stats.samples_per_s:,.0f} samples/s")
        if self._bar is not None:
            self._bar.update(self._task, completed=epoch, description=line)
        else:
            log.info(line)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
