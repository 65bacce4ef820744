"""The metrics file: rank 0's params and metrics as JSON lines, one record per line.

``training/`` writes it (``<out_dir>/metrics.jsonl``, appended, flushed per record) and
``registry.relay`` tails it into an MLflow run, so the worker never imports MLflow when a
parent process relays. A record is one of::

    {"time_ms": 1764460800123, "step": 40, "metrics": {"train/train_loss": 0.31, ...}}
    {"time_ms": 1764460800001, "params": {"train.global_batch": "64", ...}}

Names are the MLflow keys as logged; ``time_ms`` is the worker's wall clock (ms since the
epoch) and ``step`` the optimizer step, so the relayed curves are the ones the worker saw.
A reader only takes complete lines: a line still being written is left for the next read.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def params_record(params: Mapping[str, Any], time_ms: int) -> dict:
    return {"time_ms": int(time_ms), "params": {str(k): str(v) for k, v in params.items()}}


def metrics_record(values: Mapping[str, Any], step: int, time_ms: int) -> dict:
    return {"time_ms": int(time_ms), "step": int(step), "metrics": {str(k): float(v) for k, v in values.items()}}


class MetricsWriter:
    """Appends records to one metrics file; opened at the first write, flushed after each."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._f = None

    def write(self, record: dict) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
            if _ends_mid_line(self.path):
                # A writer killed mid-line (a torchrun restart): end that line, so this record
                # starts on its own and only the torn one is lost.
                self._f.write("\n")
        # One write of a whole line (short: one syscall), then out of Python's buffer.
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _ends_mid_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def file_size(path: Path) -> int:
    """Bytes in ``path`` now (0 when it does not exist): where a reader starts to skip older records."""
    try:
        return Path(path).stat().st_size
    except FileNotFoundError:
        return 0


def read_records(path: Path, offset: int) -> tuple[list[dict], int]:
    """The complete records after byte ``offset`` and the offset just past the last of them.

    A trailing line without its newline is not consumed (the writer may be mid-write). A
    complete line that is not a record (a torn line a killed writer left) is skipped with
    a warning. A missing file reads as empty; a file shorter than ``offset`` (replaced) is
    read from its start.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
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
