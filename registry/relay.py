"""Relay a training job's metrics file into an MLflow run, live, from the process that waits on the job.

Rank 0 appends its params and metrics to ``<out_dir>/metrics.jsonl`` (``core.metrics_file``)
and never talks to MLflow; this side tails the file from a byte offset in a background
thread and sends what is new with ``log_batch`` every ``interval_s``. Leaving the
``with relay_metrics(...)`` block does a last, complete pass after the job has ended, so
every complete record is logged exactly once. Timestamps and steps are the worker's.

Relaying never fails training: an MLflow error is a warning, and the records that were not
sent are tried again on the next pass (up to ``MAX_ATTEMPTS`` times, then dropped with a
warning that says how many).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.metrics_file import file_size, read_records
from registry.values import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH, MAX_PARAM_VALUE_LENGTH, chunks

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3


class MetricsRelay:
    """Tails ``path`` from byte ``start`` into run ``run_id``; ``flush()`` sends what is complete so far."""

    def __init__(self, run_id: str, path: Path, start: int = 0, client=None):
        self.run_id, self.path, self.offset = run_id, Path(path), start
        self._client = client
        self._pending: list[tuple[str, list]] = []  # ("params" | "metrics", batch), in file order
        self._attempts = 0
        self._lock = threading.Lock()
        self.logged = {"params": 0, "metrics": 0}
        self.dropped = 0

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
            self._send()  # catches and counts each batch's failure

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
                metrics += [Metric(k, float(v), int(rec["time_ms"]), int(rec.get("step", 0)))
                            for k, v in (rec.get("metrics") or {}).items()]
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


@contextmanager
def relay_metrics(run_id: str, path: Path, interval_s: float = 0.5, start: int | None = None,
                  client=None) -> Iterator[MetricsRelay]:
    """Relay ``path`` into ``run_id`` while the block runs, then once more completely after it.

    ``start`` is the byte offset to read from; by default the file's size on entry, so the
    records of an earlier job in the same folder (a resumed run's, logged by its own run)
    are not logged again. A caller that starts the job before entering passes the size it
    took before launching (``core.metrics_file.file_size``).
    """
    relay = MetricsRelay(run_id, path, file_size(path) if start is None else start, client)
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
