"""The table suite the GX runner (``validation.gx_run``) runs: a table's train and test splits
against its reviewed expectations file (``core.expectations``).

The checks are written once, over Arrow record batches: a table read whole (frames in memory,
files up to ``STREAM_ABOVE_BYTES``) is one batch a split; a larger one, or a folder of Parquet
files, is read batch by batch (``tasks.columnar.iter_batches``) in bounded memory, and
``gx_run.ItemBatches`` merges the batches' results into one, as if GX had validated the whole frame.

GX costs milliseconds per expectation whatever the data size, so per-column checks run on
derived frames (on digits, 21 expectations hold 655 checks):

* ``<split>``: the split itself: columns exactly ``exp.names`` in order, the label column exists,
  the row count in ``exp.rows[split]``, not-null for the columns not stacked below, and each
  column's ``values`` (a class label: the class set).
* ``<split>_schema``: one row per expected column present (``column, dtype, expected, found,
  feature``, ``found``: integer | float | string | boolean | null | other); (expected, found) must
  be compatible, and a feature column must hold numbers, text or booleans.
* ``<split>_cells``: the numeric columns stacked long (``column, row, value, min, max``): ``value``
  not null (unless the column allows nulls), ``value >= min``, ``max >= value``. Only the cells
  that can fail are given to GX, with the batch's counts; the unexpected cells are split back into
  one failure per column with its exact count.
* ``<split>_balance`` (a class label): one row per class of ``exp.classes`` with its share of the
  split; ``fraction`` in ``exp.class_share`` (a dropped class has share 0).
* ``cross``: the rows whose hash both splits hold (first occurrence in each); ``row_hash`` unique,
  so a row present in both splits fails.

A float column whose values are all whole numbers is an integer column (found ``integer``, dtype
``Int64``, and GX sees it cast so): a null turns an int CSV column into float64, and that null is
reported once, as a null. Rows are 0-based positions in the split (CSV line = row + 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tasks.base import label_key
from validation.gx_run import (SUMMARY, Item, ItemBatches, Run, complete, need_splits, run_item, start_run,
                               write_report)
from validation.report import failures_from_results, fmt_bound, sort_failures

if TYPE_CHECKING:
    import pandas as pd

    from core.expectations import TableExpectations

NAME = "table"
SPLITS = ("train", "test")

# Index level names of the cells frame (distinct from its column names).
CELL_INDEX = ("cell_column", "cell_row", "cell_value", "cell_min", "cell_max")
# (expected type, type found in the data) pairs that pass; "null": an all-null column (its
# nulls are the nulls check's business).
TYPE_PAIRS = [("integer", "integer"), ("float", "float"), ("float", "integer"), ("string", "string"),
              ("boolean", "boolean"), *((t, "null") for t in ("integer", "float", "string", "boolean"))]
NUMERIC = ("integer", "float", "null")
# What a feature column may hold: numbers, and text or booleans (categories). "other" (mixed kinds,
# dates as objects, ...) cannot be encoded.
FEATURE_TYPES = ("integer", "float", "string", "boolean", "null")


# --------------------------------------------------------------------------- the suite protocol (gx_run)
# A table plan's params (``tasks.tabular``): dataset, root, seed, stratify (how one file is split),
# expectations, features, label, class_label (the label is a class set), leak_policy, dates.


def identity(params: dict) -> dict:
    """What makes this suite's result (``gx_run.suite_key`` hashes it with the code): the expectations,
    the columns' roles and, for one file split by seed, how it is cut."""
    ds = params["dataset"]
    split = {"file": ds.file, "seed": params["seed"], "test_fraction": ds.test_fraction,
             "stratify": params["stratify"]} if ds.file is not None else None
    return {"expectations": params["expectations"].model_dump(mode="json"), "features": list(params["features"]),
            "label": params["label"], "class_label": bool(params["class_label"]), "split": split,
            **({"leak_policy": params["leak_policy"]} if params.get("leak_policy") == "warn" else {}),
            "split_groups": "row_hashes" if ds.file is not None else None,
            **({"dates": dict(params["dates"])} if params.get("dates") else {})}


def run(params: dict, report_dir: Path) -> dict:
    """Validate the plan's splits and write the report files into ``report_dir``. Files up to
    ``STREAM_ABOVE_BYTES`` are read whole as training reads them (``tasks.table.load_frames``), so
    the report names the dtypes training gets; larger ones batch by batch. Raises ValueError when
    the plan's columns contradict its expectations file, DataUnavailableError for unreadable data."""
    if streamed(params):
        _check_label_bounds(params, None)
        return _validate(params, _file_source(params), Path(report_dir))
    from tasks.table import load_frames

    frames = load_frames(params["dataset"], params["root"], params["seed"], params["stratify"])
    _check_label_bounds(params, frames)
    return _validate(params, _frame_source(frames), Path(report_dir))


def _check_label_bounds(params: dict, frames: dict | None) -> None:
    """``tasks.bounds``' limits on a class label, before any suite is built: the classes are the
    expectations file's and those in ``frames``; the rows, the labeled rows of ``frames`` (None: the
    files' rows where their footers tell, else only the class count is bounded)."""
    import pandas as pd

    from tasks.bounds import MIN_ROWS_PER_CLASS, check_class_names, check_classes
    from tasks.columnar import source_rows
    from tasks.table import split_paths

    label, exp = params["label"], params["expectations"]
    if not params["class_label"]:
        return
    classes = {label_key(c) for c in exp.classes or []}
    where = f"{params['dataset'].expectations_file or 'the expectations'} and the data"
    if frames is not None:
        values = pd.concat([f[label] for f in frames.values() if label in f.columns], ignore_index=True).dropna()
        classes |= set(values.astype(str).unique())
        rows = len(values)
    else:
        counts = [source_rows(p) for p in split_paths(params["dataset"], params["root"]).values()]
        # A CSV's rows are unknown before it is read: then only the number of classes is bounded.
        rows = sum(counts) if None not in counts else MIN_ROWS_PER_CLASS * len(classes)
    check_class_names(sorted(classes), label, where)
    check_classes(len(classes), rows, label, where)


def failures(params: dict, run: Run, items: list[Item]) -> list[dict]:
    """One report entry per failed check, in split, table, column, balance, leak order. Rows found
    in both splits are a warning instead (``"severity": "warning"``) under ``leak_policy: warn``."""
    triples = [(item.split, item.kind, evr) for item, evr in run.results(items)]
    out = sort_failures(failures_from_results(triples, label_column=params["label"]), params["expectations"].names)
    if params.get("leak_policy", "fail") == "warn":
        for f in (f for f in out if f["check"] == "leak"):
            f["severity"] = "warning"
            f["message"] += " (dataset.leak_policy: warn)"
    return out


# --------------------------------------------------------------------------- where the batches come from


@dataclass
class _Source:
    """A table's splits as the checks read them: Arrow record batches, in each split's row order."""

    schemas: dict[str, Any]  # split -> pyarrow.Schema of its batches (each column name once)
    empties: dict[str, Any]  # split -> its columns as read, no rows (pandas: names, repeats, dtypes)
    # split -> {column: found type} known before the batches are read, where the Arrow type would
    # say otherwise (a frame's all-null and mixed-kind columns).
    found: dict[str, dict[str, str]]
    # (sizes) -> (split, RecordBatch, offset, the batch's pandas frame or None); fills ``sizes``
    # with each split's rows where they are known before the first batch.
    batches: Callable[[dict], Any]


def _frame_source(frames: dict[str, pd.DataFrame]) -> _Source:
    """Frames in memory (every one of SPLITS), one batch a split. ValueError when a split is missing."""
    need_splits(NAME, SPLITS, frames)
    batches, found = {}, {}
    for s in SPLITS:
        batches[s], found[s] = _frame_batch(frames[s])

    def read(sizes: dict):
        sizes.update({s: batches[s].num_rows for s in SPLITS})
        # The frame goes along: GX validates it as it is, not as Arrow holds it.
        return ((s, batches[s], 0, frames[s]) for s in SPLITS)

    return _Source({s: batches[s].schema for s in SPLITS}, {s: frames[s].iloc[:0] for s in SPLITS}, found, read)


def _frame_batch(df: pd.DataFrame) -> tuple[Any, dict[str, str]]:
    """``df`` as one RecordBatch (a repeated name: its first column), and the found type of the
    columns whose Arrow type would say otherwise: "null" for an all-null column, "other" for an
    object column holding anything but text. A column Arrow cannot hold (mixed kinds) is held as
    its values' text forms: the checks take from it only presence, class (``label_key``) and row
    hash; GX reads the frame itself."""
    import pandas as pd
    import pyarrow as pa

    arrays, found = [], {}
    positions = _first_positions(df)
    for name, i in positions.items():
        s = df.iloc[:, i]
        if s.isna().all():
            found[str(name)] = "null"
        elif s.dtype == object and not s.dropna().map(type).eq(str).all():
            found[str(name)] = "other"
        try:
            array = pa.array(s, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            found.setdefault(str(name), "other")
            array = pa.array([None if pd.isna(v) else label_key(v) for v in s], type=pa.string())
        # A pyarrow-backed column (pandas' str) may come in chunks; a batch holds one array each.
        arrays.append(array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array)
    return pa.RecordBatch.from_arrays(arrays, names=[str(n) for n in positions]), found


def _file_source(params: dict) -> _Source:
    """The plan's files, read batch by batch (``tasks.columnar.iter_batches``; ``params["batch_rows"]``
    rows a batch, default ``tasks.columnar.BATCH_ROWS``) in bounded memory, whatever their size."""
    from tasks.columnar import BATCH_ROWS, source_schema
    from tasks.table import split_paths

    batch_rows = int(params.get("batch_rows") or BATCH_ROWS)
    paths = split_paths(params["dataset"], params["root"])  # {"train", "test"}, or {"all"}: one file split by seed
    schemas = {s: source_schema(paths.get(s, paths.get("all"))) for s in SPLITS}
    return _Source(schemas, {s: schemas[s].empty_table().to_pandas() for s in SPLITS}, {s: {} for s in SPLITS},
                   lambda sizes: _batches(params, paths, batch_rows, sizes))


# Split files larger than this together are read batch by batch: read whole, a split is held as its
# pandas frame and its Arrow batch at once, several times a Parquet file's size on disk
# (benchmarks/validation_memory.py measures a table read in batches).
STREAM_ABOVE_BYTES = 32 << 20


def streamed(params: dict) -> bool:
    """Read the files batch by batch: a split is a folder (of Parquet files), or the split files
    hold more than ``params.get("stream_above_bytes", STREAM_ABOVE_BYTES)`` bytes."""
    from tasks.table import split_paths

    paths = list(split_paths(params["dataset"], params["root"]).values())
    if any(p.is_dir() for p in paths):
        return True
    return sum(p.stat().st_size for p in paths if p.is_file()) > params.get("stream_above_bytes", STREAM_ABOVE_BYTES)


def _batches(params: dict, paths: dict[str, Path], batch_rows: int, sizes: dict):
    """``(split, RecordBatch, offset, None)`` in each split's row order; one file is split by seed
    as ``tasks.table.load_frames`` splits it. ``sizes`` gets each split's rows before the first
    batch where they are known without reading the data (Parquet footers, the seeded split)."""
    import numpy as np
    import pyarrow as pa

    from tasks.columnar import iter_batches, source_rows

    if "all" not in paths:
        sizes.update({s: source_rows(paths[s]) for s in SPLITS})
        for s in SPLITS:
            offset = 0
            for batch in iter_batches(paths[s], batch_rows=batch_rows):
                yield s, batch, offset, None
                offset += batch.num_rows
        return
    from tasks.table import row_hashes, seeded_split

    ds, src = params["dataset"], paths["all"]
    # Equal rows stay on one side, as load_frames splits them: one pass of row hashes (8 bytes a
    # row); the label read whole as load_frames reads it (its dtype sets the stratification's groups).
    hashes = [row_hashes(batch.to_pandas()) for batch in iter_batches(src, batch_rows=batch_rows)]
    groups = np.concatenate(hashes or [np.zeros(0, dtype=np.uint64)])
    del hashes
    labels = None
    if params["stratify"]:
        import pandas as pd

        try:
            labels = (pd.read_csv(src, usecols=[ds.label]) if src.suffix.lower() == ".csv"
                      else pd.read_parquet(src, columns=[ds.label]))[ds.label]
        except (ValueError, KeyError):
            labels = None
    n = len(groups)
    _, held = seeded_split(labels, n, ds.test_fraction, params["seed"], params["stratify"], groups=groups)
    del groups
    is_test = np.zeros(n, dtype=bool)
    is_test[np.asarray(held, dtype=np.int64)] = True
    sizes.update(train=n - len(held), test=len(held))
    del held, labels
    offsets, start = {"train": 0, "test": 0}, 0
    for batch in iter_batches(src, batch_rows=batch_rows):
        m = is_test[start:start + batch.num_rows]
        start += batch.num_rows
        for s, mask in (("train", ~m), ("test", m)):
            part = batch.filter(pa.array(mask))
            if part.num_rows:
                yield s, part, offsets[s], None
                offsets[s] += part.num_rows


# --------------------------------------------------------------------------- per batch


def _first_positions(df: pd.DataFrame) -> dict[str, int]:
    """Column name -> position of its first occurrence (a frame may repeat a name)."""
    return {name: i for i, (name, again) in enumerate(zip(df.columns, df.columns.duplicated())) if not again}


def _coerce_integral(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with 0..n-1 row labels, whole-number float columns cast to nullable Int64."""
    import pandas as pd

    out = df.reset_index(drop=True)  # a copy; rows are positions from here on
    for i in range(out.shape[1]):
        s = out.iloc[:, i]
        if pd.api.types.is_float_dtype(s.dtype) and _whole(s.dropna().to_numpy(dtype="float64"), empty=False):
            out.isetitem(i, s.astype("Int64"))
    return out


def _whole(v, empty: bool = True) -> bool:
    """Every value of the float array ``v`` is a whole number an int64 holds exactly."""
    import numpy as np

    return (bool(len(v)) or empty) and bool(np.isfinite(v).all() and (v == np.round(v)).all()
                                            and (np.abs(v) < 2**53).all())


def _float_column(batch, name: str):
    """A batch's column as float64 numpy, nulls as NaN; integers beyond 2**53 rounded (unchecked:
    a 64-bit id must not stop the validation)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.cast(batch.column(name), pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def _row_hash_array(batch, columns: list[str]):
    """uint64 per row over ``columns``: numbers hashed as float64 (3, 3.0 and Int64 3 alike; a
    null as NaN), anything else by its text (pandas': it has one for every Arrow type)."""
    import pandas as pd
    import pyarrow as pa

    def canon(c: str):
        t = batch.schema.field(c).type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t):
            return _float_column(batch, c)
        return batch.column(c).to_pandas().astype("string")

    frame = pd.DataFrame({c: canon(c) for c in columns})
    return pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype="uint64")


def _cell_suspects(batch, columns: list, offset: int, expectations: list):
    """The cells of ``batch`` that can fail the stacked checks (null where not allowed, below its
    min, above its max: exactly the cells GX reports), as a cells frame, and the counts GX would
    give on the whole stacked batch: ``{expectation index: {"element_count", "missing_count"}}``.
    Every other cell passes by construction: the stacked frame of a whole batch is never built."""
    import numpy as np

    block = np.empty((len(columns), batch.num_rows), dtype="float64")
    for j, c in enumerate(columns):
        block[j] = _float_column(batch, c.name)
    nan = float("nan")
    lo = np.array([[nan if c.min is None else c.min] for c in columns], dtype="float64")
    hi = np.array([[nan if c.max is None else c.max] for c in columns], dtype="float64")
    null = np.isnan(block)
    keep = ~(np.array([[c.nulls] for c in columns], dtype=bool) & null)
    with np.errstate(invalid="ignore"):
        suspect = keep & (null | (block < lo) | (block > hi))
    kept = int(keep.sum())
    missing = {"min": int((keep & (null | np.isnan(lo))).sum()), "max": int((keep & (null | np.isnan(hi))).sum())}
    j, r = np.nonzero(suspect)  # row-major over (column, row): column by column, as the stacked frame
    names = np.array([c.name for c in columns], dtype=object)
    frame = _cells_from(names[j], (r + offset).astype("int64"), block[j, r], lo[j, 0], hi[j, 0])
    counts = {}
    for i, e in enumerate(expectations):
        if e.expectation_type == "expect_column_values_to_not_be_null":
            counts[i] = {"element_count": kept}
        elif e.expectation_type == "expect_column_pair_values_a_to_be_greater_than_b":
            counts[i] = {"element_count": kept, "missing_count": missing["min" if e.column_A == "value" else "max"]}
    return frame, counts


def _cells_from(column, row, values, lo, hi) -> pd.DataFrame:
    """The cells frame of parallel arrays (column name, row, value, min, max)."""
    import pandas as pd

    if _whole(values):  # int64 keeps examples as 99 rather than 99.0
        values = values.astype("int64")
    # The identifying columns are a named index too: GX then reads an unexpected cell's
    # (column, row, value, bounds) from the index tuple instead of one ``.at`` lookup per cell.
    index = pd.MultiIndex.from_arrays([column, row, values, lo, hi], names=list(CELL_INDEX))
    return pd.DataFrame({"column": column, "row": row, "value": values, "min": lo, "max": hi}, index=index)


# --------------------------------------------------------------------------- the whole split


def _arrow_found(arrow_type, stats, known: str | None = None) -> str:
    """A column's found type: by its Arrow type unless the source knows better (``known``); once
    its batches are read, by its statistics too (no value: null; only whole numbers: integer)."""
    import pyarrow as pa

    if stats is not None and not stats.count:  # no value (or no row)
        return "null"
    if known is not None:
        return known
    if pa.types.is_floating(arrow_type):
        return "integer" if stats is not None and stats.integral else "float"
    for kind, test in (("null", pa.types.is_null), ("boolean", pa.types.is_boolean), ("integer", pa.types.is_integer),
                       ("string", pa.types.is_string), ("string", pa.types.is_large_string)):
        if test(arrow_type):
            return kind
    return "other"


def _schema_rows(exp: TableExpectations, features: list[str], schema, dtypes: dict[str, str],
                 known: dict[str, str], stats: dict | None) -> pd.DataFrame:
    """The schema frame of the expected columns ``schema`` holds; a float column of whole numbers
    reads Int64, as GX sees it cast (``_coerce_integral``)."""
    import pandas as pd

    info = {}
    for f in schema:
        if f.name in exp.names and f.name not in info:
            found = _arrow_found(f.type, stats.get(f.name) if stats else None, known.get(f.name))
            integral = found == "integer" and dtypes[f.name].lower().startswith("float")
            info[f.name] = ("Int64" if integral else dtypes[f.name], found)
    present = [c for c in exp.columns if c.name in info]
    return pd.DataFrame({
        "column": [c.name for c in present], "dtype": [info[c.name][0] for c in present],
        "expected": [c.type for c in present], "found": [info[c.name][1] for c in present],
        "feature": [info[c.name][1] if c.name in features else None for c in present],
    }, dtype=object)


def _stacked_columns(exp: TableExpectations, schema: pd.DataFrame) -> list:
    """The expected integer/float columns the data holds as numbers (or only nulls): checked stacked."""
    found = dict(zip(schema["column"], schema["found"]))
    return [c for c in exp.columns if c.type in ("integer", "float") and found.get(c.name) in NUMERIC]


def _balance_rows(classes: list, counts: dict[str, int], n: int) -> pd.DataFrame:
    """The balance frame from ``{class text form: count}`` and the split's row count."""
    import pandas as pd

    count = [int(counts.get(label_key(k), 0)) for k in classes]
    return pd.DataFrame({
        "label": pd.Series(classes, dtype="object"),
        "count": pd.Series(count, dtype="int64"),
        "fraction": pd.Series([c / n if n else 0.0 for c in count], dtype="float64"),
    })


def _cross_from_hashes(hashes: dict[str, list]) -> tuple[pd.DataFrame, int]:
    """The cross frame of the rows whose hash both splits hold (first occurrence in each split):
    the only rows the uniqueness check can fail on; and the row count of the whole cross frame
    (de-duplicated rows of both splits). Memory: the hashes plus a sorted copy of the smaller
    split's; the larger split is looked up in chunks, then sorted in place to count its rows."""
    import numpy as np
    import pandas as pd

    h = {}
    for s in SPLITS:  # a preallocated array, or the batches' arrays when the rows were not known
        part = hashes[s]
        h[s] = part if isinstance(part, np.ndarray) else (np.concatenate(part) if part else np.zeros(0, dtype="uint64"))
        hashes[s] = None
    small, large = sorted(SPLITS, key=lambda s: len(h[s]))
    probe = np.sort(h[small])
    hits = []
    if len(probe):
        for start in range(0, len(h[large]), 1 << 20):
            part = h[large][start:start + (1 << 20)]
            idx = np.minimum(np.searchsorted(probe, part), len(probe) - 1)
            hits.append(np.flatnonzero(probe[idx] == part) + start)
    leaked = np.unique(h[large][np.concatenate(hits)]) if hits else np.zeros(0, dtype="uint64")
    parts, total = [], 0
    for s in SPLITS:
        pos = np.flatnonzero(np.isin(h[s], leaked))  # leaked is small: a short scan
        u, first = np.unique(h[s][pos], return_index=True)
        rows = pos[first]
        order = np.argsort(rows, kind="stable")
        parts.append(pd.DataFrame({"row_hash": np.array([f"{x:016x}" for x in u[order]], dtype=object),
                                   "split": s, "row": rows[order].astype("int64")}))
        h[s].sort()  # in place: no copy of the larger split
        total += int(len(h[s]) and 1 + np.count_nonzero(h[s][1:] != h[s][:-1]))
    return pd.concat(parts, ignore_index=True), total


# --------------------------------------------------------------------------- the plan


def _names_text(names: list[str]) -> str:
    """``pixel_0 … pixel_63`` for a run of (3 or more) numbered names, else the names, comma-separated."""
    parts: list[str] = []
    run: list[str] = []
    last = None  # (prefix, number) of run's last name
    for name in [*names, None]:
        m = re.fullmatch(r"(.*?)(\d+)", name) if name is not None else None
        key = (m.group(1), int(m.group(2))) if m else None
        if key and last and key == (last[0], last[1] + 1):
            run.append(name)
        else:
            parts += [f"{run[0]} … {run[-1]}"] if len(run) > 2 else run
            run = [name] if key else []
            parts += [name] if name is not None and not key else []
        last = key
    return ", ".join(parts)


def _bound_text(columns: list, key: str) -> str:
    """``min 0: pixel_0 … pixel_63; min 10.2: alcohol`` — columns grouped by their bound."""
    groups: dict[float, list[str]] = {}
    for c in columns:
        if getattr(c, key) is not None:
            groups.setdefault(getattr(c, key), []).append(c.name)
    return "; ".join(f"{key} {fmt_bound(b)}: {_names_text(n)}" for b, n in groups.items())


def _cells_expectations(columns: list) -> tuple[list, list[int]]:
    """The stacked cells' expectations and how many columns each covers."""
    import great_expectations.expectations as gxe

    not_null = [c.name for c in columns if not c.nulls]
    with_min = [c for c in columns if c.min is not None]
    with_max = [c for c in columns if c.max is not None]
    pair = dict(or_equal=True, ignore_row_if="either_value_is_missing")
    # ``description`` is what Data Docs show: the user's column names, not the stacked "value".
    out = [(not_null, lambda: gxe.ExpectColumnValuesToNotBeNull(
               column="value", description=f"not null: {_names_text(not_null)}")),
           (with_min, lambda: gxe.ExpectColumnPairValuesAToBeGreaterThanB(
               column_A="value", column_B="min", **pair,
               description=f"each value at least its column's {_bound_text(with_min, 'min')}")),
           (with_max, lambda: gxe.ExpectColumnPairValuesAToBeGreaterThanB(
               column_A="max", column_B="value", **pair,
               description=f"each value at most its column's {_bound_text(with_max, 'max')}"))]
    return [make() for cols, make in out if cols], [len(cols) for cols, _ in out if cols]


def _split_items(params: dict, s: str, names: list[str], schema: pd.DataFrame, skipped: list[dict]) -> list[Item]:
    """One split's items: the split itself, its schema (``schema``: as known before the batches are
    read; it decides which columns are stacked), its stacked cells and class balance. ``names``:
    the split's columns; ``params["dates"]``: ``{column: strftime format}`` of the date columns
    (``dataset.dates``), whose every value must parse. The frames are the batches' and those built
    once they are read."""
    import great_expectations.expectations as gxe

    exp, features, label, dates = params["expectations"], params["features"], params["label"], params.get("dates")
    pos = set(names)
    stacked = _stacked_columns(exp, schema)
    stacked_names = {c.name for c in stacked}
    split = [gxe.ExpectTableColumnsToMatchOrderedList(column_list=exp.names), gxe.ExpectColumnToExist(column=label)]
    if s in exp.rows:
        split.append(gxe.ExpectTableRowCountToBeBetween(min_value=exp.rows[s][0], max_value=exp.rows[s][1]))
    for c in (c for c in exp.columns if c.name in pos):
        if c.name not in stacked_names and not c.nulls:
            split.append(gxe.ExpectColumnValuesToNotBeNull(column=c.name))
        if c.values is not None:
            split.append(gxe.ExpectColumnValuesToBeInSet(column=c.name, value_set=list(c.values)))
        if c.name in (dates or {}):
            split.append(gxe.ExpectColumnValuesToMatchStrftimeFormat(column=c.name, strftime_format=dates[c.name]))
    items = [Item(s, s, "split", None, split, SUMMARY)]

    present_features = [f for f in features if f in pos]
    schema_exp = [gxe.ExpectColumnPairValuesToBeInSet(
        column_A="expected", column_B="found", value_pairs_set=TYPE_PAIRS,
        description="each column holds its expected type (integer | float | string | boolean)")]
    if present_features:
        schema_exp.append(gxe.ExpectColumnValuesToBeInSet(
            column="feature", value_set=list(FEATURE_TYPES),
            description=f"features hold numbers, text or booleans: {_names_text(present_features)}"))
    items.append(Item(f"{s}_schema", s, "schema", schema, schema_exp, complete("column", "dtype", "expected", "found"),
                      [len(schema), len(present_features)][:len(schema_exp)]))

    not_numeric = [c.name for c in exp.columns
                   if c.type in ("integer", "float") and c.name in pos and c.name not in stacked_names]
    if not_numeric:
        skipped.append({"split": s, "check": "range", "reason": f"not numeric: {', '.join(not_numeric)}"})
    cells_exp, covers = _cells_expectations(stacked)
    if cells_exp:
        items.append(Item(f"{s}_cells", s, "cells", None, cells_exp, complete(*CELL_INDEX), covers))

    if not params["class_label"]:
        return items
    if label not in pos:
        skipped.append({"split": s, "check": "nulls, label_set, class_balance", "reason": f"no {label!r} column"})
    elif exp.classes is None:
        skipped.append({"split": s, "check": "label_set, class_balance",
                        "reason": f"the expectations file lists no values (class set) for {label!r}"})
    elif exp.class_share is not None:
        lo, hi = exp.class_share
        items.append(Item(f"{s}_balance", s, "balance", None,
                          [gxe.ExpectColumnValuesToBeBetween(column="fraction", min_value=lo, max_value=hi)],
                          complete("label", "fraction")))
    return items


# Split expectations validated once on a small frame instead of per batch (the row count: on N rows).
_TABLE_LEVEL = ("expect_table_columns_to_match_ordered_list", "expect_column_to_exist",
                "expect_table_row_count_to_be_between")


# --------------------------------------------------------------------------- validation


def _validate(params: dict, source: _Source, report_dir: Path) -> dict:
    """Every check of the suite over ``source``'s batches; the report files into ``report_dir``. Never
    raises on bad data: every problem is a failure in the report (``validation.gx_run.write_report``).

    Per batch, GX validates the split item's row-level expectations on the columns they read and
    the cells that can fail the stacked checks; the column statistics, class counts and row hashes
    are folded in. Then, per split, GX validates on small frames what needs the whole split: the
    schema, the class balance, the column list and row count; and the leak check.
    """
    import time

    started = time.perf_counter()
    import great_expectations.expectations as gxe
    import numpy as np
    import pandas as pd

    from tasks.columnar import ColumnStats

    exp, features, label = params["expectations"], list(params["features"]), params["label"]
    unknown = [c for c in [*features, label] if c not in exp.names]
    if unknown:  # the plan's columns contradict its expectations file
        raise ValueError(f"column(s) {unknown} are not in the expectations file (columns: {exp.names})")
    if exp.label is not None and exp.label != label:
        raise ValueError(f"label: the config reads {label!r}, the expectations file says {exp.label!r}")
    schemas = source.schemas
    dtypes = {s: {str(n): str(source.empties[s].dtypes.iloc[i])
                  for n, i in _first_positions(source.empties[s]).items()} for s in SPLITS}

    skipped: list[dict] = []
    items: list[Item] = []
    stacked: dict[str, list] = {}
    for s in SPLITS:
        schema = _schema_rows(exp, features, schemas[s], dtypes[s], source.found[s], None)
        stacked[s] = _stacked_columns(exp, schema)
        items += _split_items(params, s, schemas[s].names, schema, skipped)
    by_name = {item.name: item for item in items}

    run = start_run(started)
    # A stacked cells result keeps its examples and exact count per column (the report's entries).
    batched = {s: {kind: ItemBatches(run, by_name[name], group_by="cell_column" if kind == "cells" else None)
                   for kind, name in (("split", s), ("cells", f"{s}_cells")) if name in by_name} for s in SPLITS}
    # Value counts only for a balance check's label: a regression target's (continuous) values
    # would each get a dict entry, most of the peak memory on a large table.
    stats = {s: {n: ColumnStats(n, values={} if n == label and f"{s}_balance" in by_name else None)
                 for n in schemas[s].names} for s in SPLITS}
    cross_columns = [c for c in exp.names if all(c in schemas[s].names for s in SPLITS)]
    hashes: dict = {}
    sizes: dict = {}
    rows = {s: 0 for s in SPLITS}
    # The columns the split item's row-level expectations read, in the split's order.
    used = {s: {e.column for e in by_name[s].expectations if e.expectation_type not in _TABLE_LEVEL} for s in SPLITS}
    row_level = {s: [n for n in schemas[s].names if n in used[s]] for s in SPLITS}

    def feed(s: str, batch, offset: int, frame=None) -> None:
        # The frame's columns where the batch came from one (it may hold what Arrow cannot: mixed kinds).
        if frame is None:
            df = batch.select(row_level[s]).to_pandas()
        else:
            pos = _first_positions(frame)
            df = frame.iloc[:, [pos[c] for c in row_level[s]]]
        df = _coerce_integral(df)
        df.index = pd.RangeIndex(offset, offset + batch.num_rows)
        batched[s]["split"].add(df)
        if "cells" in batched[s]:
            batched[s]["cells"].add(*_cell_suspects(batch, stacked[s], offset, by_name[f"{s}_cells"].expectations))

    read: set[str] = set()
    for s, batch, offset, frame in source.batches(sizes):
        for i, name in enumerate(batch.schema.names):
            if name in stats[s]:
                stats[s][name].update(batch.column(i))
        feed(s, batch, offset, frame)
        if cross_columns:
            if s not in hashes:  # filled in place when the rows are known: no copy to join them
                hashes[s] = np.empty(sizes[s], dtype="uint64") if sizes.get(s) is not None else []
            h = _row_hash_array(batch, cross_columns)
            if isinstance(hashes[s], list):
                hashes[s].append(h)
            else:
                hashes[s][offset:offset + len(h)] = h
        rows[s] = offset + batch.num_rows
        read.add(s)
        del batch, frame

    for s in SPLITS:
        if s not in read:  # a split with no batch (an empty file): its checks on no rows
            import pyarrow as pa

            feed(s, pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schemas[s]], schema=schemas[s]), 0)
        by_name[f"{s}_schema"].frame = _schema_rows(exp, features, schemas[s], dtypes[s], source.found[s], stats[s])
        run_item(run, by_name[f"{s}_schema"])
        if f"{s}_balance" in by_name:
            counts: dict[str, int] = {}
            for v, k in (stats[s][label].values or {}).items():
                counts[label_key(v)] = counts.get(label_key(v), 0) + k
            by_name[f"{s}_balance"].frame = _balance_rows(exp.classes, counts, stats[s][label].count)
            run_item(run, by_name[f"{s}_balance"])
        # Table-level checks on the split's columns with no rows, the row count on N rows and no
        # columns (a RangeIndex: no memory).
        batched[s]["split"].finish({i: pd.DataFrame(index=pd.RangeIndex(rows[s]))
                                    if isinstance(e, gxe.ExpectTableRowCountToBeBetween) else source.empties[s]
                                    for i, e in enumerate(by_name[s].expectations)
                                    if e.expectation_type in _TABLE_LEVEL})
        if "cells" in batched[s]:
            batched[s]["cells"].finish()
    if cross_columns:
        # Every duplicated hash is listed, so each leaked row is paired train <-> test.
        frame, total = _cross_from_hashes({s: hashes.get(s, []) for s in SPLITS})
        item = Item("cross", "cross", "cross", frame, [gxe.ExpectColumnValuesToBeUnique(column="row_hash")],
                    complete("row_hash", "split", "row"))
        leaks = ItemBatches(run, item)  # GX's counts as on the whole cross frame
        leaks.add(item.frame, {0: {"element_count": total, "missing_count": 0}})
        leaks.finish()
        items.append(item)
    else:
        skipped.append({"split": "cross", "check": "leak", "reason": "train and test share no expected column"})
    return write_report(run, items, Path(report_dir), failures=failures(params, run, items), rows=rows,
                        skipped=skipped)
