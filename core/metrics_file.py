"""The metrics file: rank 0's params and metrics as JSON lines, which ``registry.relay`` tails into MLflow::

    {"time_ms": 1764460800123, "step": 40, "metrics": {"train/train_loss": 0.31, ...}}
    {"time_ms": 1764460800001, "params": {"train.global_batch": "64", ...}}

Beside it, ``mlflow_run.json`` records which MLflow run the folder's training logs into and how much
of the file that run already has, so a resumed training logs into the same run, nothing twice.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def params_record(params: Mapping[str, Any], time_ms: int) -> dict:
    return {"time_ms": int(time_ms), "params": {str(k): str(v) for k, v in params.items()}}


def metrics_record(values: Mapping[str, Any], step: int, time_ms: int) -> dict:
    return {"time_ms": int(time_ms), "step": int(step), "metrics": {str(k): float(v) for k, v in values.items()}}


class MetricsWriter:
    """Appends JSON records to one file, a line each, flushed after each (in the kernel: survives
    the writer's SIGKILL). ``separators``: ``json.dumps``'."""

    def __init__(self, path: Path, separators: tuple[str, str] | None = (",", ":")):
        self.path, self.separators = Path(path), separators
        self._f = None

    def write(self, record: dict) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
            if self._f.tell() > 0:
                with open(self.path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":  # a writer killed mid-line: only the torn line is lost
                        self._f.write("\n")
        self._f.write(json.dumps(record, separators=self.separators) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def file_size(path: Path) -> int:
    """Bytes in ``path`` now (0 when it does not exist): where a reader starts to skip older records."""
    try:
        return Path(path).stat().st_size
    except FileNotFoundError:
        return 0


def read_records(path: Path, offset: int) -> tuple[list[dict], int]:
    """The complete records after byte ``offset`` and the offset just past the last of them. A line
    without its newline is left for the next read; a line that is not a record is skipped, warned."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < offset:
                log.warning("%s shrank below the %d bytes already read; reading it from the start", path, offset)
                offset = 0
            f.seek(offset)
            data = f.read(size - offset)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    records = []
    for line in data[: end + 1].splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "time_ms" not in rec or not ("metrics" in rec or "params" in rec):
                raise ValueError("not a params or metrics record")
        except ValueError as exc:
            log.warning("%s: skipped a malformed line (%s): %.80r", path, exc, line)
            continue
        records.append(rec)
    return records, offset + end + 1


# -- the run record: which MLflow run a training folder's metrics go to -------------------------
RUN_FILE = "mlflow_run.json"
# A recorded run is only logged into again when it carries both tags, equal to this training's.
CONFIG_TAG = "trainflow.training.config_id"
OUT_DIR_TAG = "trainflow.training.out_dir"
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")  # MLflow's run ids: a recorded one is never a path or a query
_MAX_RECORD_BYTES = 4096


def run_tags(config_id: str, out_dir: Path) -> dict[str, str]:
    """The tags a run gets when a training folder records it (``verify_recorded_run`` checks them)."""
    return {CONFIG_TAG: str(config_id), OUT_DIR_TAG: str(Path(out_dir).resolve())}


def write_run_record(out_dir: Path, run_id: str, config_id: str, relayed_bytes: int | None = None) -> None:
    """Record atomically in ``out_dir/mlflow_run.json`` that this folder's training logs into
    ``run_id``; ``relayed_bytes``: how much of the metrics file that run already has."""
    out_dir = Path(out_dir)
    rec = {"run_id": run_id, "config_id": str(config_id), "out_dir": str(out_dir.resolve())}
    if relayed_bytes is not None:
        rec["relayed_bytes"] = int(relayed_bytes)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{RUN_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(rec))
    tmp.replace(out_dir / RUN_FILE)


def read_run_record(out_dir: Path) -> dict | None:
    """The folder's run record, or None (with a warning when it is not one). Untrusted: it only names
    a run to *check* (``verify_recorded_run``)."""
    path = Path(out_dir) / RUN_FILE
    try:
        if path.stat().st_size > _MAX_RECORD_BYTES:
            raise ValueError(f"larger than {_MAX_RECORD_BYTES} bytes")
        rec = json.loads(path.read_text())
        if not isinstance(rec, dict) or not isinstance(rec.get("run_id"), str) or not _RUN_ID.match(rec["run_id"]):
            raise ValueError("run_id: not an MLflow run id")
        relayed = rec.get("relayed_bytes", 0)
        if isinstance(relayed, bool) or not isinstance(relayed, int) or relayed < 0:
            raise ValueError(f"relayed_bytes: must be an int >= 0, got {relayed!r}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s ignored (%s): no MLflow run is resumed from it", path, exc)
        return None
    return rec


def verify_recorded_run(get_run: Callable[[str], Any], rec: dict, config_id: str, out_dir: Path) -> str | None:
    """Why the recorded run may not be logged into (None: it may): it must be in this tracking
    store (``get_run``: an MLflow client's), not deleted, and carry ``run_tags(config_id, out_dir)``."""
    run_id = rec["run_id"]
    try:
        run = get_run(run_id)
    except Exception as exc:  # not in this store (another server, a fresh database), or unreachable
        return f"run {run_id} is not in this tracking store ({type(exc).__name__})"
    if getattr(run.info, "lifecycle_stage", "active") != "active":
        return f"run {run_id} is deleted"
    have = run.data.tags
    for key, value in run_tags(config_id, out_dir).items():
        if have.get(key) != value:
            return f"run {run_id} has {key}={have.get(key)!r}, this training {value!r}"
    return None


def latest_steps(run: Any) -> dict[str, int]:
    """``{metric key: its last step}`` already in an MLflow run (one ``get_run``, no history): what a
    resumed logger skips, so a step a restarted attempt runs again is not logged twice."""
    return {m.key: int(m.step) for m in getattr(run.data, "_metric_objs", None) or []}
