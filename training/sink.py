"""Where rank 0's metrics go: ``<out_dir>/metrics.jsonl``, an MLflow run (optional), a progress bar or log lines.

Other ranks get a sink that drops everything, so the loop never checks the rank.
Rank 0 always appends its params and metrics to the metrics file (``core.metrics_file``;
cheap, no MLflow import). The pipeline relays that file into its MLflow run from its own
process (``registry.relay``), so training never waits on the tracking store. Only when
``TRAINFLOW_MLFLOW_RUN_ID`` names a run (a pod or command with no relaying parent) does
rank 0 also log into that run itself, synchronously; without it MLflow stays unused.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from core.metrics_file import METRICS_FILE, MetricsWriter, metrics_record, params_record

log = logging.getLogger("trainflow.train")

RUN_ID_ENV = "TRAINFLOW_MLFLOW_RUN_ID"


class MetricsSink:
    def __init__(self, enabled: bool, run_id: str | None = None, progress: bool | None = None,
                 out_dir: Path | None = None):
        self.enabled = enabled
        self.run_id = run_id if enabled else None
        self._file = MetricsWriter(Path(out_dir) / METRICS_FILE) if enabled and out_dir is not None else None
        self._client = None
        self._bar = None
        self._task = None
        self.progress = enabled and (sys.stderr.isatty() if progress is None else progress)

    @classmethod
    def for_rank(cls, is_main: bool, out_dir: Path | None = None) -> "MetricsSink":
        """Rank 0's sink (``is_main``) writes ``out_dir/metrics.jsonl``; other ranks' drop everything."""
        return cls(enabled=is_main, run_id=os.environ.get(RUN_ID_ENV) or None, out_dir=out_dir)

    @property
    def client(self):
        if self._client is None and self.run_id:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient()
        return self._client

    def params(self, params: dict) -> None:
        named = {f"train.{k}": v for k, v in params.items()}
        if self._file is not None:
            self._file.write(params_record(named, int(time.time() * 1000)))
        if self.client:
            from mlflow.entities import Param

            self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in named.items()])
        if self.enabled:
            log.info("training: %s", ", ".join(f"{k}={v}" for k, v in params.items()))

    def metrics(self, values: dict, step: int) -> None:
        if not self.enabled:
            return
        now = int(time.time() * 1000)
        if self._file is not None:
            self._file.write(metrics_record(values, step, now))
        if self.client:
            from mlflow.entities import Metric

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
        self.metrics({f"train/{k}": v for k, v in d.items() if v is not None}, step=epoch)
        acc = "" if stats.val_accuracy is None else f"val_acc {stats.val_accuracy:.4f} "
        line = (f"epoch {epoch}: loss {stats.train_loss:.4f} val_loss {stats.val_loss:.4f} "
                f"{acc}{stats.samples_per_s:,.0f} samples/s")
        if self._bar is not None:
            self._bar.update(self._task, completed=epoch, description=line)
        else:
            log.info(line)

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
