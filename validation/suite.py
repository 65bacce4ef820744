"""Load the dataset splits and validate them with Great Expectations 1.x suites built from config.

Nothing heavy at import: pandas and great_expectations are imported inside the functions.
The caller sets ``GX_ANALYTICS_ENABLED=false`` (see ``core.env``); this module never touches
``os.environ``.

GX spends ~10-20 ms of Python per expectation whatever the data size, so one expectation per
column and split (~270) took 4-5 s here. The per-column checks therefore run on derived frames,
one GX data asset, suite and validation definition each: 17 expectations in all, 0.6-1 s on
the digits data including Data Docs:

* ``<split>``: the split itself. Columns exactly ``cfg.columns`` in order, the row count, and the
  label column not null and in ``range(n_classes)``.
* ``<split>_schema``: one row per configured column present (``column, dtype``); ``dtype`` must be
  an integer dtype (unexpected rows name the columns).
* ``<split>_cells``: the numeric feature columns stacked long (``column, row, value``); ``value``
  must not be null and must lie in ``[value_min, value_max]``. The unexpected ``(column, row)``
  pairs are split back into one failure per column, with that column's exact count.
* ``<split>_balance``: one row per class ``0..n_classes-1`` with its share of the split
  (``label, count, fraction``); ``fraction`` must lie in ``expectations.class_fraction``. A class
  absent from the split has fraction 0, so a dropped class fails.
* ``cross``: the de-duplicated row hashes of train and of test, concatenated
  (``row_hash, split, row``); ``row_hash`` must be unique, so a row present in both splits fails.

Before validation a float column whose non-null values are all whole numbers is cast to pandas'
nullable ``Int64``: a null turns an int CSV column into float64, and that null is then reported
once, as a null, not a second time as a wrong dtype. Non-integral floats and strings still fail the
dtype check; a non-numeric feature column is left out of the cells frame (listed in ``skipped``).
Rows are 0-based positions in the split (CSV line = row + 2).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import DatasetConfig
from core.errors import DataUnavailableError
from validation.report import (
    failures_from_results,
    jsonable,
    sort_failures,
    summary_markdown,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["load_splits", "validate_dataset", "summary_markdown", "suite_hash", "data_hash", "DATA_DOCS_SITE"]

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
# The ephemeral context already has a site called "local_site" (STACK-NOTES, GX gotcha 5).
DATA_DOCS_SITE = "trainflow_data_docs"
RESULT_JSON = "gx_result.json"
SUMMARY_MD = "summary.md"
DATA_DOCS_DIR = "data_docs"

# numpy and pandas-nullable integer dtypes, as ``str(series.dtype)`` names them.
INTEGER_DTYPES = [
    *(f"{p}int{b}" for p in ("", "u") for b in (8, 16, 32, 64)),
    *(f"{p}Int{b}" for p in ("", "U") for b in (8, 16, 32, 64)),
]

# Index level names of the cells frame (distinct from its column names).
CELL_INDEX = ("cell_column", "cell_row", "cell_value")

_SUMMARY = {
    "result_format": "SUMMARY",
    "partial_unexpected_count": 5,
    "return_unexpected_index_query": False,
}


def _complete(*index_columns: str) -> dict:
    """Every unexpected row of a derived frame, as ``index_columns`` (the domain column included).

    COMPLETE, so the cells frame yields every (column, row) pair and exact per-column counts.
    ``exclude_unexpected_values`` makes GX return one dict of lists instead of a dict per row,
    and no separate value list; with the cells frame's named index (``CELL_INDEX``) GX reads
    the pairs from the index instead of one ``.at`` lookup per cell. With all ~92k cells of
    train failing, the run took ~8 s instead of ~13 s.
    """
    return {
        "result_format": "COMPLETE",
        "unexpected_index_column_names": list(index_columns),
        "exclude_unexpected_values": True,
        "return_unexpected_index_query": False,
    }


def _split_path(cfg: DatasetConfig, root: Path, split: str) -> Path:
    if cfg.kind == "text":
        name = cfg.text.train_file if split == "train" else cfg.text.eval_file
    else:
        name = cfg.train_file if split == "train" else cfg.test_file
    return Path(root) / cfg.path / name


def _splits_of(cfg: DatasetConfig) -> tuple[str, ...]:
    if cfg.kind == "text":
        from validation import text_suite

        return text_suite.SPLITS
    return SPLITS


def load_splits(cfg: DatasetConfig, root: Path) -> dict[str, pd.DataFrame]:
    """Read ``{"train": df, "test": df}`` from ``root/cfg.path``. Raises DataUnavailableError.

    A text corpus (``cfg.kind == "text"``) gives ``{"train", "eval"}`` document frames instead
    (``validation.text_suite``).
    """
    if cfg.kind == "text":
        from validation import text_suite

        return text_suite.load_splits(cfg, root)
    import pandas as pd

    splits: dict[str, pd.DataFrame] = {}
    for split in SPLITS:
        path = _split_path(cfg, root, split)
        if not path.is_file():
            raise DataUnavailableError(
                f"{split} split not found: {path} does not exist. The DVC-tracked data "
                f"({cfg.dvc_file}) is missing from the workspace; run `dvc pull` in {Path(root)}."
            )
        try:
            splits[split] = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
            raise DataUnavailableError(f"{split} split {path} cannot be read as CSV: {exc}") from None
    return splits


def suite_hash(cfg: DatasetConfig) -> str:
    """Identity of the expectation suite ``validate_dataset`` builds for ``cfg``.

    The suite is a function of the dataset config, this module's and ``validation.report``'s
    code and the GX version, so the hash covers exactly those (without importing GX): any
    change to a bound, a column or the suite code gives a new hash.
    """
    from importlib.metadata import PackageNotFoundError, version

    from core.hashing import file_sha256, sha256_json

    here = Path(__file__).resolve().parent
    try:
        gx_version = version("great_expectations")
    except PackageNotFoundError:
        gx_version = "missing"
    return sha256_json({
        "dataset": cfg.model_dump(mode="json", exclude={"dvc_file"}),
        "code": [file_sha256(here / name) for name in ("suite.py", "report.py", "text_suite.py")],
        "gx": gx_version,
    })


def data_hash(cfg: DatasetConfig, root: Path) -> str:
    """sha256 over the bytes of the split files the suite reads (what is in the workspace,
    not what ``data.dvc`` claims: an edit nobody ``dvc add``-ed is never taken for validated).
    Raises DataUnavailableError when a split file is missing."""
    from core.hashing import file_sha256, sha256_json

    digests = []
    for split in _splits_of(cfg):
        path = _split_path(cfg, root, split)
        if not path.is_file():
            raise DataUnavailableError(
                f"{split} split not found: {path} does not exist. The DVC-tracked data "
                f"({cfg.dvc_file}) is missing from the workspace; run `dvc pull` in {Path(root)}."
            )
        digests.append([split, file_sha256(path)])
    return sha256_json(digests)


# --------------------------------------------------------------------------- derived frames


def _first_positions(df: pd.DataFrame) -> dict[str, int]:
    """Column name -> position of its first occurrence (a frame may repeat a name)."""
    pos: dict[str, int] = {}
    for i, name in enumerate(df.columns):
        pos.setdefault(name, i)
    return pos


def _coerce_integral(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with 0..n-1 row labels, whole-number float columns cast to nullable Int64."""
    import numpy as np
    import pandas as pd

    out = df.reset_index(drop=True)  # a copy; rows are positions from here on
    for i in range(out.shape[1]):
        s = out.iloc[:, i]
        if pd.api.types.is_float_dtype(s.dtype):
            v = s.dropna().to_numpy(dtype="float64")
            if np.isfinite(v).all() and (v == np.round(v)).all() and (np.abs(v) < 2**53).all():
                out.isetitem(i, s.astype("Int64"))
    return out


def _numeric_features(cfg: DatasetConfig, df: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(numeric feature columns present, non-numeric feature columns present)."""
    import pandas as pd

    pos = _first_positions(df)
    numeric, other = [], []
    for c in cfg.feature_columns:
        if c in pos:
            dtype = df.dtypes.iloc[pos[c]]
            ok = pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
            (numeric if ok else other).append(c)
    return numeric, other


def _schema_frame(cfg: DatasetConfig, df: pd.DataFrame) -> pd.DataFrame:
    """One row per configured column present in the split: its name and dtype."""
    import pandas as pd

    pos = _first_positions(df)
    present = [c for c in cfg.columns if c in pos]
    return pd.DataFrame(
        {
            "column": pd.Series(present, dtype="object"),
            "dtype": pd.Series([str(df.dtypes.iloc[pos[c]]) for c in present], dtype="object"),
        }
    )


def _cells_frame(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``columns`` stacked long: (column, row, value), column by column."""
    import numpy as np
    import pandas as pd

    pos = _first_positions(df)
    n = len(df)
    block = df.iloc[:, [pos[c] for c in columns]].to_numpy(dtype="float64", na_value=np.nan)
    values = block.T.reshape(-1)  # column-major: all rows of the first column, then the next
    # int64 keeps examples as 99 rather than 99.0; GX compares int64/float64 vectorised.
    if not np.isnan(values).any() and (values == np.round(values)).all():
        values = values.astype("int64")
    column = np.repeat(np.array(columns, dtype=object), n)
    row = np.tile(np.arange(n, dtype="int64"), len(columns))
    # The identifying columns are a named index too: GX then reads an unexpected cell's
    # (column, row, value) from the index tuple instead of one ``.at`` lookup per cell.
    index = pd.MultiIndex.from_arrays([column, row, values], names=list(CELL_INDEX))
    return pd.DataFrame({"column": column, "row": row, "value": values}, index=index)


def _balance_frame(cfg: DatasetConfig, df: pd.DataFrame) -> pd.DataFrame:
    """One row per class 0..n_classes-1: its count and share of all rows in the split."""
    import pandas as pd

    labels = pd.to_numeric(df.iloc[:, _first_positions(df)[cfg.label_column]], errors="coerce")
    counts = labels.value_counts(dropna=True)
    classes = list(range(cfg.n_classes))
    count = [int(counts.get(k, 0)) for k in classes]
    n = len(df)
    return pd.DataFrame(
        {
            "label": pd.Series(classes, dtype="int64"),
            "count": pd.Series(count, dtype="int64"),
            "fraction": pd.Series([c / n if n else 0.0 for c in count], dtype="float64"),
        }
    )


def _row_hashes(df: pd.DataFrame, columns: list[str]) -> pd.Series:
    """A hex hash per row over ``columns``, equal for equal values whatever the int dtype."""
    import pandas as pd

    pos = _first_positions(df)
    # A canonical text form: int64 3 and (coerced) Int64 3 both hash as "3".
    canon = df.iloc[:, [pos[c] for c in columns]].astype("string")
    canon.columns = columns
    hashes = pd.util.hash_pandas_object(canon, index=False)
    return hashes.map(lambda h: f"{h:016x}")


def _cross_frame(cfg: DatasetConfig, frames: dict[str, pd.DataFrame]) -> pd.DataFrame | None:
    """De-duplicated row hashes of each split, concatenated: a hash seen twice is a leak."""
    import pandas as pd

    columns = [c for c in cfg.columns if all(c in frames[s].columns for s in SPLITS)]
    if not columns:
        return None
    parts = []
    for split in SPLITS:
        h = _row_hashes(frames[split], columns)
        first = ~h.duplicated(keep="first")
        parts.append(
            pd.DataFrame(
                {
                    "row_hash": h[first].to_numpy(dtype=object),
                    "split": split,
                    "row": h.index[first].to_numpy(dtype="int64"),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


# --------------------------------------------------------------------------- suites


def _split_expectations(cfg: DatasetConfig, split: str, with_label: bool) -> list:
    import great_expectations.expectations as gxe

    lo, hi = cfg.expectations.train_rows if split == "train" else cfg.expectations.test_rows
    out = [
        gxe.ExpectTableColumnsToMatchOrderedList(column_list=list(cfg.columns)),
        gxe.ExpectTableRowCountToBeBetween(min_value=lo, max_value=hi),
    ]
    if with_label:
        out += [
            gxe.ExpectColumnValuesToNotBeNull(column=cfg.label_column),
            gxe.ExpectColumnValuesToBeInSet(
                column=cfg.label_column, value_set=list(range(cfg.n_classes))
            ),
        ]
    return out


def _schema_expectations() -> list:
    import great_expectations.expectations as gxe

    return [gxe.ExpectColumnValuesToBeInSet(column="dtype", value_set=INTEGER_DTYPES)]


def _cells_expectations(cfg: DatasetConfig) -> list:
    import great_expectations.expectations as gxe

    exp = cfg.expectations
    return [
        gxe.ExpectColumnValuesToNotBeNull(column="value"),
        gxe.ExpectColumnValuesToBeBetween(
            column="value", min_value=exp.value_min, max_value=exp.value_max
        ),
    ]


def _balance_expectations(cfg: DatasetConfig) -> list:
    import great_expectations.expectations as gxe

    lo, hi = cfg.expectations.class_fraction
    return [gxe.ExpectColumnValuesToBeBetween(column="fraction", min_value=lo, max_value=hi)]


def _cross_expectations() -> list:
    import great_expectations.expectations as gxe

    return [gxe.ExpectColumnValuesToBeUnique(column="row_hash")]


def _plan(cfg: DatasetConfig, frames: dict[str, pd.DataFrame], skipped: list[dict]) -> list[dict]:
    """The frames to validate: name, report split, kind, frame, expectations, result format."""

    def item(name, split, kind, frame, expectations, result_format, covers=1) -> dict:
        return dict(name=name, split=split, kind=kind, frame=frame, expectations=expectations,
                    result_format=result_format, covers=covers)

    plan: list[dict] = []
    for s in SPLITS:
        df = frames[s]
        has_label = cfg.label_column in df.columns
        plan.append(item(s, s, "split", df, _split_expectations(cfg, s, has_label), _SUMMARY))
        plan.append(item(f"{s}_schema", s, "schema", _schema_frame(cfg, df),
                         _schema_expectations(), _complete("column", "dtype")))
        numeric, other = _numeric_features(cfg, df)
        if other:
            skipped.append({"split": s, "check": "nulls, range",
                            "reason": f"not numeric: {', '.join(other)}"})
        if numeric:
            # Each of its two expectations stands for one check per column it covers.
            plan.append(item(f"{s}_cells", s, "cells", _cells_frame(df, numeric),
                             _cells_expectations(cfg), _complete(*CELL_INDEX), covers=len(numeric)))
        if has_label:
            plan.append(item(f"{s}_balance", s, "balance", _balance_frame(cfg, df),
                             _balance_expectations(cfg), _complete("label", "fraction")))
        else:
            skipped.append({"split": s, "check": "nulls, label_set, class_balance",
                            "reason": f"no {cfg.label_column!r} column"})
    cross = _cross_frame(cfg, frames)
    if cross is not None:
        # Every duplicated hash is listed, so each leaked row is paired train <-> test.
        plan.append(item("cross", "cross", "cross", cross,
                         _cross_expectations(), _complete("row_hash", "split", "row")))
    else:
        skipped.append({"split": "cross", "check": "leak",
                        "reason": "train and test share no configured column"})
    return plan


# --------------------------------------------------------------------------- validation


def validate_dataset(
    cfg: DatasetConfig, splits: dict[str, pd.DataFrame], report_dir: Path
) -> dict:
    """Run the expectation suites on ``splits`` and write the report files into ``report_dir``.

    Never raises on bad data: every problem is a failure in the returned report (see
    ``validation.report`` for the failure shape). Returns a JSON-serialisable dict::

        {"success": bool,
         "n_expectations": int,  # checks: a stacked-cells expectation counts once per column
         "n_failed": int,        # == len(failures)
         "failures": [...], "duration_s": float,
         "files": {"result_json", "summary_md", "data_docs"},   # data_docs None if not built
         "rows": {"train": n, "test": n},
         "skipped": [{"split", "check", "reason"}],              # checks that could not run
         "gx": {"version", "expectations", "failed"}}            # GX's own counts
    """
    if cfg.kind == "text":
        from validation import text_suite

        return text_suite.validate_dataset(cfg, splits, report_dir)
    started = time.perf_counter()
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    missing = [s for s in SPLITS if s not in splits]
    if missing:
        raise ValueError(f"validate_dataset needs splits {list(SPLITS)}; missing {missing}")
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)

    frames = {s: _coerce_integral(splits[s]) for s in SPLITS}
    skipped: list[dict] = []
    plan = _plan(cfg, frames, skipped)

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    datasource = context.data_sources.add_pandas(name="trainflow")
    run_id = gx.RunIdentifier(run_name="trainflow-validate")

    raw: dict[str, dict] = {}
    triples: list[tuple[str, str, dict]] = []
    n_checks = 0
    gx_failed = 0
    for item in plan:
        name = item["name"]
        batch = datasource.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe(
            name=f"{name}_whole"
        )
        suite = context.suites.add(
            gx.ExpectationSuite(name=f"trainflow_{name}", expectations=item["expectations"])
        )
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"trainflow_{name}", data=batch, suite=suite)
        )
        try:
            result = definition.run(
                batch_parameters={"dataframe": item["frame"]},
                result_format=item["result_format"],
                run_id=run_id,
            )
            raw[name] = result.to_json_dict()
        except Exception as exc:  # noqa: BLE001 - report, never crash on data GX chokes on
            log.warning("GX could not validate %s: %s: %s", name, type(exc).__name__, exc)
            raw[name] = _errored_result(item["expectations"], exc)
        for evr in raw[name].get("results", []):
            triples.append((item["split"], item["kind"], evr))
            n_checks += item["covers"]
            gx_failed += 0 if evr.get("success") else 1

    failures = sort_failures(
        failures_from_results(triples, label_column=cfg.label_column), list(cfg.columns)
    )
    (report_dir / RESULT_JSON).write_text(
        json.dumps(
            jsonable(
                {
                    "great_expectations_version": gx.__version__,
                    "run_id": run_id.to_json_dict(),
                    "success": all(r.get("success") for r in raw.values()),
                    "validations": raw,
                }
            ),
            indent=1,
            allow_nan=False,
        )
    )
    files = {
        "result_json": str(report_dir / RESULT_JSON),
        "summary_md": str(report_dir / SUMMARY_MD),
        "data_docs": _build_data_docs(context, report_dir),
    }
    report = jsonable(
        {
            "success": not failures and not skipped,
            "n_expectations": n_checks,
            "n_failed": len(failures),
            "failures": failures,
            "duration_s": round(time.perf_counter() - started, 3),
            "files": files,
            "rows": {s: int(len(splits[s])) for s in SPLITS},
            "skipped": skipped,
            "gx": {"version": gx.__version__, "expectations": len(triples), "failed": gx_failed},
        }
    )
    (report_dir / SUMMARY_MD).write_text(summary_markdown(report))
    return report


def _errored_result(expectations: list, exc: Exception) -> dict:
    """A suite result in GX's JSON shape where every expectation failed with ``exc``."""
    message = f"{type(exc).__name__}: {exc}"
    return {
        "success": False,
        "error": message,
        "results": [
            {
                "success": False,
                "expectation_config": e.configuration.to_json_dict(),
                "result": {},
                "exception_info": {"raised_exception": True, "exception_message": message},
            }
            for e in expectations
        ],
    }


def _build_data_docs(context: Any, report_dir: Path) -> str | None:
    """Data Docs HTML under report_dir/data_docs; a warning and None if building fails."""
    base = (report_dir / DATA_DOCS_DIR).resolve()
    try:
        context.add_data_docs_site(
            site_name=DATA_DOCS_SITE,
            site_config={
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(base),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
                # Validation pages only: they show each expectation with its result; suite
                # pages would repeat the expectations and double the build time.
                "site_section_builders": {"expectations": "0", "profiling": "0"},
            },
        )
        context.build_data_docs(site_names=[DATA_DOCS_SITE])
    except Exception as exc:  # noqa: BLE001 - docs are a convenience; the JSON is the record
        log.warning("Data Docs were not built (%s: %s); see %s", type(exc).__name__, exc, RESULT_JSON)
        return None
    index = base / "index.html"
    if not index.is_file():
        log.warning("Data Docs build wrote no %s", index)
        return None
    return str(index)
