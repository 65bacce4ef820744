"""Where rank 0's metrics go: ``<out_dir>/metrics.jsonl``, an MLflow run (optional), a progress bar or log lines.

Other ranks get a sink that drops everything, so the loop never checks the rank. The pipeline
relays the metrics file into its MLflow run from its own process (``registry.relay``). Only when
``TRAINFLOW_MLFLOW_RUN_ID`` names a run (no relaying parent) does rank 0 log into it itself;
unset, it logs into the run ``<out_dir>/mlflow_run.json`` records once that run checks out
(``core.metrics_file``); empty (the pipeline's jobs: it relays) keeps MLflow off.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from core.metrics_file import (METRICS_FILE, RUN_FILE, MetricsWriter, latest_steps, metrics_record, params_record,
                               read_run_record, run_tags, verify_recorded_run, write_run_record)

log = logging.getLogger("trainflow.train")

RUN_ID_ENV = "TRAINFLOW_MLFLOW_RUN_ID"


class MetricsSink:
    def __init__(self, enabled: bool, run_id: str | None = None, out_dir: Path | None = None,
                 config_id: str | None = None):
        self.enabled = enabled
        self.run_id = run_id if enabled else None
        self.out_dir, self.config_id = out_dir, config_id
        self._record_pending = bool(self.run_id and out_dir is not None and config_id)
        self._last_step: dict[str, int] = {}
        self._file = MetricsWriter(Path(out_dir) / METRICS_FILE) if enabled and out_dir is not None else None
        self._client = self._bar = self._task = None
        self.progress = enabled and sys.stderr.isatty()

    @classmethod
    def for_rank(cls, is_main: bool, out_dir: Path | None = None, config_id: str | None = None) -> "MetricsSink":
        """Rank 0's sink (``is_main``) writes ``out_dir/metrics.jsonl``; other ranks' drop everything."""
        env = os.environ.get(RUN_ID_ENV)
        run_id = env or None
        if is_main and env is None and out_dir is not None and config_id:
            run_id = recorded_run(out_dir, config_id)
        return cls(enabled=is_main, run_id=run_id, out_dir=out_dir, config_id=config_id)

    @property
    def client(self):
        if self._client is None and self.run_id:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient()
        return self._client

    def _record(self) -> None:
        """Once, before the first MLflow call: tag the run as this training's, record it here, and
        note each metric's last step in it (a restarted attempt repeats steps already logged)."""
        from mlflow.entities import RunTag

        self._record_pending = False
        self._last_step = latest_steps(self.client.get_run(self.run_id))
        before = read_run_record(self.out_dir)
        if before is not None and before["run_id"] != self.run_id:
            log.warning("%s named MLflow run %s; this training logs into %s (%s) from now on",
                        self.out_dir, before["run_id"], self.run_id, RUN_ID_ENV)
        tags = run_tags(self.config_id, self.out_dir)
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        write_run_record(self.out_dir, self.run_id, self.config_id)

    def params(self, params: dict) -> None:
        named = {f"train.{k}": v for k, v in params.items()}
        if self._record_pending:
            self._record()
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

            if self._record_pending:
                self._record()
            new = [Metric(k, float(v), now, step) for k, v in values.items() if step > self._last_step.get(k, -1)]
            self._last_step.update({m.key: step for m in new})
            if new:
                self.client.log_batch(self.run_id, metrics=new)

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
        d.update({f"val_{k}": v for k, v in d.pop("val_scores", {}).items()})
        self.metrics({f"train/{k}": v for k, v in d.items() if v is not None and v == v}, step=epoch)  # not NaN
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


def recorded_run(out_dir: Path, config_id: str) -> str | None:
    """The MLflow run ``out_dir`` records for this training, once checked against the tracking
    store; None, with a warning, when it fails a check."""
    rec = read_run_record(out_dir)
    if rec is None:
        return None
    from mlflow.tracking import MlflowClient

    problem = verify_recorded_run(MlflowClient().get_run, rec, config_id, out_dir)
    if problem:
        log.warning("not resuming MLflow logging from %s: %s; metrics go to %s only",
                    Path(out_dir) / RUN_FILE, problem, METRICS_FILE)
        return None
    log.info("resuming MLflow run %s recorded in %s", rec["run_id"], out_dir)
    return rec["run_id"]
