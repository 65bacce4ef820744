"""Runs a task's validation plan (``tasks.base.ValidationPlan``) with the GX runner it names.

``table``: the reviewed per-column expectations on a table's splits (``validation.suite``);
``text``: the corpus suite (``validation.text_suite``). The cache key of a validation is
``(data_key, suite_key)``: the bytes of the plan's files and the suite's identity.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import DataUnavailableError


def data_key(plan) -> str:
    """sha256 over the bytes of the files the plan reads (what is in the workspace, not what the
    DVC file claims: an edit nobody ``dvc add``-ed is never taken for validated)."""
    from core.hashing import file_sha256, sha256_json

    digests = []
    for path in plan.files:
        if not Path(path).is_file():
            raise DataUnavailableError(f"{path} does not exist. The DVC-tracked data is missing from the workspace; "
                                       "run `dvc pull` (or check the config's dataset paths)")
        digests.append([Path(path).name, file_sha256(path)])
    return sha256_json(digests)


def suite_key(plan) -> str:
    """Identity of the suite the plan runs: its parameters, the validation code and the GX version."""
    from importlib.metadata import PackageNotFoundError, version

    from core.hashing import file_sha256, sha256_json

    here = Path(__file__).resolve().parent
    try:
        gx_version = version("great_expectations")
    except PackageNotFoundError:
        gx_version = "missing"
    params = {k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v)
              for k, v in plan.params.items() if k != "root"}
    return sha256_json({"runner": plan.runner, "params": params, "gx": gx_version,
                        "code": [file_sha256(p) for p in sorted(here.glob("*.py"))]})


def run_plan(plan, report_dir: Path) -> dict:
    """Validate: the report dict of ``validation.suite`` (never raises on bad data)."""
    return RUNNERS[plan.runner](plan, Path(report_dir))


def _table(plan, report_dir: Path) -> dict:
    from tasks.table import load_frames
    from validation.suite import validate_table

    p = plan.params
    frames = load_frames(p["dataset"], p["root"], p["seed"], p["stratify"])
    return validate_table(p["expectations"], p["features"], p["label"], frames, report_dir, p["classification"])


def _text(plan, report_dir: Path) -> dict:
    from validation import text_suite

    p = plan.params
    return text_suite.validate_text(p["dataset"], text_suite.load_splits(p["dataset"], p["root"]), report_dir)


RUNNERS = {"table": _table, "text": _text}
