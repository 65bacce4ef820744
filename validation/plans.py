"""Runs a task's validation plan (``tasks.base.ValidationPlan``) with the GX runner it names.

``table``: the reviewed per-column expectations on a table's splits (``validation.suite``);
``text``: the corpus suite (``validation.text_suite``). The cache key of a validation is
``(data_key, suite_key)``: the bytes of the plan's files and the suite's identity.
"""

from __future__ import annotations

from pathlib import Path


def data_key(plan) -> str:
    """sha256 over the bytes of the files the plan reads (DataUnavailableError names a missing one)."""
    from validation.suite import table_data_hash

    return table_data_hash(plan.files)


def suite_key(plan) -> str:
    """Identity of the suite the plan runs (its runner's hash), and of how its splits are cut."""
    return SUITE_KEYS[plan.runner](plan)


def run_plan(plan, report_dir: Path) -> dict:
    """Validate: the report dict of ``validation.suite`` (never raises on bad data)."""
    return RUNNERS[plan.runner](plan, Path(report_dir))


def _table(plan, report_dir: Path) -> dict:
    from tasks.table import load_frames
    from validation.suite import validate_table

    p = plan.params
    frames = load_frames(p["dataset"], p["root"], p["seed"], p["stratify"])
    return validate_table(p["expectations"], p["features"], p["label"], frames, report_dir, p["classification"])


def _table_key(plan) -> str:
    from core.hashing import sha256_json
    from validation.suite import table_suite_hash

    p, ds = plan.params, plan.params["dataset"]
    # One file is split by seed into train and test: another seed or fraction is other data.
    split = {"file": ds.file, "seed": p["seed"], "test_fraction": ds.test_fraction, "stratify": p["stratify"]}
    return sha256_json([table_suite_hash(p["expectations"], p["features"], p["label"], p["classification"]),
                        split if ds.file is not None else None])


def _text(plan, report_dir: Path) -> dict:
    from validation import text_suite

    ds = plan.params["dataset"]
    return text_suite.validate_text(ds, text_suite.load_splits(ds, plan.params["root"]), report_dir)


def _text_key(plan) -> str:
    from validation.text_suite import text_suite_hash

    return text_suite_hash(plan.params["dataset"])


RUNNERS = {"table": _table, "text": _text}
SUITE_KEYS = {"table": _table_key, "text": _text_key}
