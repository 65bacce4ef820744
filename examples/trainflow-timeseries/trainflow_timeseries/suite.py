"""The example's validation suite (``SequenceForecast.validation_plan`` names it by import path; the GX
runner, ``validation.gx_run``, runs it): a window of fewer than two past values is refused before any
check, then trainflow's table checks run against the reviewed expectations file.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import DataUnavailableError
from validation import suite as table

NAME, SPLITS = "sequence-forecast", table.SPLITS


def identity(params: dict) -> dict:
    """The table suite's parts and its code (the runner hashes this module's own)."""
    from core.hashing import file_sha256

    return {**table.identity(params), "table_suite": file_sha256(Path(table.__file__))}


def run(params: dict, report_dir: Path) -> dict:
    if len(params["features"]) < 2:
        raise DataUnavailableError(f"a window needs at least 2 past values, got columns {params['features']}")
    return table.run(params, report_dir)
