"""The validation result cache: one JSON file per (data hash, suite hash), never a pickle.

A cached result is read with ``json.loads`` alone, so a file someone wrote there can at worst
claim a result, never run code; one that is not a result for these very keys is ignored, with a
warning. Not Prefect's result persistence: its record names its serializer inside the file, so a
record written under a predictable key would be unpickled whatever the task asked for.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 1
# What a report must hold to stand in for running the suite (``validation.gx_run.write_report``).
_FIELDS = {"success": bool, "n_expectations": int, "n_failed": int, "failures": list}


def cache_file(folder: Path, data_key: str, suite_key: str) -> Path:
    """Where the result of ``suite_key`` on ``data_key`` is kept under ``folder``."""
    return Path(folder) / f"{data_key[:16]}-{suite_key[:16]}.json"


def read(path: Path, data_key: str, suite_key: str) -> dict | None:
    """The cached report for exactly these keys, else None (missing, unreadable, or not one)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_bytes())
        problem = _problem(record, data_key, suite_key)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        problem = f"not JSON ({type(exc).__name__})"
    if not problem:
        return record["report"]
    log.warning("validation cache %s ignored (%s): validating again", path, problem)
    return None


def _problem(record, data_key: str, suite_key: str) -> str | None:
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return "not a trainflow validation record"
    if record.get("data_key") != data_key or record.get("suite_key") != suite_key:
        return "recorded for other data or another suite"
    report = record.get("report")
    if not isinstance(report, dict):
        return "no report"
    return next((f"report.{key} is not a {kind.__name__}" for key, kind in _FIELDS.items()
                 if not isinstance(report.get(key), kind) or (kind is int and isinstance(report.get(key), bool))), None)


def write(path: Path, data_key: str, suite_key: str, report: dict) -> None:
    """Keep ``report`` for these keys (written to a temporary name, then renamed: readers see a
    whole file or none)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": FORMAT, "data_key": data_key, "suite_key": suite_key, "report": report})
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                     delete=False) as fh:
        fh.write(text)
    os.replace(fh.name, path)
