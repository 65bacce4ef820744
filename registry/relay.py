"""Relay a training job's metrics file into an MLflow run, live, from the process that waits on the job.

Rank 0 appends params and metrics to ``<out_dir>/metrics.jsonl`` (``core.metrics_file``) and never talks
to MLflow; a background thread here tails it from a byte offset and sends what is new every
``interval_s``; leaving ``relay_metrics`` does a last, complete pass, so every complete record is logged
once. Relaying never fails training: an MLflow error is a warning and the batch is tried again (up to
``MAX_ATTEMPTS`` times, then dropped with a warning).

Given the training folder (``record=``), the relay keeps ``<out_dir>/mlflow_run.json`` at the bytes
already sent, so the next relay into the same run (a preempted training resumed) starts where this one
stopped. A metric at a step its key already has (a restarted worker group) is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.metrics_file import (
    file_size,
    latest_steps,
    read_records,
    read_run_record,
    run_tags,
    verify_recorded_run,
    write_run_record,
)
from registry.values import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH, MAX_PARAM_VALUE_LENGTH, chunks

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3


class MetricsRelay:
    """Tails ``path`` from byte ``offset`` into run ``run_id``; ``flush()`` sends what is complete so far."""

    def __init__(self, run_id: str, path: Path, record: tuple[Path, str] | None = None):
        self.run_id, self.path, self.offset = run_id, Path(path), 0
        self._client = None
        self._record = record  # (out_dir, config_id): keep its mlflow_run.json at what was sent
        self._recorded = 0
        self._last_step: dict[str, int] = {}
        self._pending: list[tuple[str, list]] = []  # ("params" | "metrics", batch), in file order
        self._attempts = 0
        self._lock = threading.Lock()
        self.logged = {"params": 0, "metrics": 0}
        self.skipped = self.dropped = 0

    @property
    def client(self):
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient()
        return self._client

    def flush(self) -> None:
        """Read the complete new records and log them; errors are warnings, never raised."""
        with self._lock:
            try:
                self._read()
            except Exception as exc:  # relaying must never stop the job or the pipeline
                log.warning("reading %s to relay into MLflow run %s: %s", self.path, self.run_id, exc)
            self._send()
            if self._record is not None and not self._pending and self._recorded != self.offset:
                try:
                    write_run_record(self._record[0], self.run_id, self._record[1], self.offset)
                    self._recorded = self.offset
                except OSError as exc:
                    log.warning("recording the relayed offset in %s: %s", self._record[0], exc)

    def drain(self, retry_wait_s: float = 0.5) -> None:
        """The last pass: read to the end and send everything, retrying a failed batch (then dropping it)."""
        self.flush()
        while self._pending:  # ends: each failed pass counts an attempt, the last one drops the batch
            time.sleep(retry_wait_s)
            self.flush()

    def _read(self) -> None:
        from mlflow.entities import Metric, Param

        records, self.offset = read_records(self.path, self.offset)
        params: dict[str, str] = {}
        metrics: list = []
        for rec in records:
            try:
                # MLflow refuses a key twice in one batch; a restarted worker logs the same params again.
                params.update({k: str(v)[:MAX_PARAM_VALUE_LENGTH] for k, v in (rec.get("params") or {}).items()})
                step = int(rec.get("step", 0))
                for k, v in (rec.get("metrics") or {}).items():
                    if step <= self._last_step.get(k, -1):
                        self.skipped += 1
                        continue
                    metrics.append(Metric(k, float(v), int(rec["time_ms"]), step))
                    self._last_step[k] = step
            except (AttributeError, TypeError, ValueError) as exc:
                log.warning("%s: skipped a record that is not params or metrics (%s): %.120r", self.path, exc, rec)
        self._pending += [("params", b) for b in chunks([Param(k, v) for k, v in params.items()],
                                                         MAX_PARAMS_TAGS_PER_BATCH)]
        self._pending += [("metrics", b) for b in chunks(metrics, MAX_METRICS_PER_BATCH)]

    def _send(self) -> None:
        while self._pending:
            kind, batch = self._pending[0]
            try:
                self.client.log_batch(self.run_id, **{kind: batch})
            except Exception as exc:
                self._attempts += 1
                if self._attempts < MAX_ATTEMPTS:
                    log.warning("relaying %d %s into MLflow run %s failed (attempt %d, will retry): %s",
                                len(batch), kind, self.run_id, self._attempts, exc)
                    return
                log.warning("relaying %d %s into MLflow run %s failed %d times; dropped them: %s",
                            len(batch), kind, self.run_id, self._attempts, exc)
                self.dropped += len(batch)
            else:
                self.logged[kind] += len(batch)
            self._pending.pop(0)
            self._attempts = 0


def resume_offset(relay: MetricsRelay, out_dir: Path, config_id: str) -> int:
    """Where ``relay`` starts: the bytes ``out_dir``'s run record says were sent when it records this very
    run (``verify_recorded_run``; each metric's last step in the run is then skipped too), else the file's
    size now (what is there was another run's). Tags the run as this training's and records it."""
    from mlflow.entities import RunTag

    run_id, client = relay.run_id, relay.client
    rec = read_run_record(out_dir)
    start = file_size(relay.path)
    if rec is not None and rec["run_id"] == run_id:
        problem = verify_recorded_run(client.get_run, rec, config_id, out_dir)
        if problem is None:
            start = min(rec.get("relayed_bytes", 0), start)
            relay._last_step = latest_steps(client.get_run(run_id))
        else:
            log.warning("%s: %s; relaying only what is written from now on", out_dir, problem)
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in run_tags(config_id, out_dir).items()])
    write_run_record(out_dir, run_id, config_id, start)
    return start


@contextmanager
def relay_metrics(run_id: str, path: Path, interval_s: float = 0.5, start: int | None = None,
                  record: tuple[Path, str] | None = None) -> Iterator[MetricsRelay]:
    """Relay ``path`` into ``run_id`` while the block runs, then once more completely after it. ``start``:
    the byte offset to read from; by default the file's size on entry, or with ``record=(out_dir,
    config_id)`` where the last relay into this same run stopped (``resume_offset``)."""
    relay = MetricsRelay(run_id, path, record)
    if start is None and record is not None:
        try:
            start = resume_offset(relay, record[0], record[1])
        except Exception as exc:  # relaying must never stop the job: relay what comes from now on
            log.warning("MLflow run %s: could not check or record it in %s: %s", run_id, record[0], exc)
    relay.offset = relay._recorded = file_size(path) if start is None else start
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            relay.flush()

    thread = threading.Thread(target=loop, name="trainflow-metrics-relay", daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        stop.set()
        thread.join()
        relay.drain()
