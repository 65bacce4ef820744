"""Turn Great Expectations results into trainflow's report: pure functions on the JSON form of GX
results (``ExpectationValidationResult.to_json_dict()``), no GX import.

A failure entry (one per failed expectation; a stacked-cells expectation gives one per column)::

    {"split": "train" | "test" | "cross",
     "check": "columns" | "label_column" | "row_count" | "dtype" | "feature_type" | "nulls" | "range"
              | "label_set" | "value_set" | "class_balance" | "leak" | "other",
     "expectation": "expect_column_values_to_not_be_null",   # the GX expectation type
     "column": "pixel_5" | None,       # None for table-level checks and the leak check
     "unexpected_count": 1 | None,     # None where GX gives no count (table-level checks)
     "examples": [...],                # up to 5 JSON values (dicts for derived frames)
     "rows": [...],                    # up to 5 0-based row positions in the split
     "detail": "1 null value (row 3)",
     "message": "train.pixel_5: 1 null value (row 3)"}   # one line for a person: where, then what

A failure with ``"severity": "warning"`` (rows in both splits under ``dataset.leak_policy: warn``)
is reported, not failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from core.printable import printable

MAX_EXAMPLES = 5
# Unexpected entries a result merged from batches keeps (per column of a stacked cells result, beside
# its exact count: ``validation.gx_run.ItemBatches``); the failing values counted are among these.
CELLS_COUNTED = 1000
# Result key of a grouped merge (``ItemBatches(group_by=...)``): {group value: exact unexpected count}.
BY_GROUP = "trainflow_unexpected_by_group"

SPLIT_ORDER = ("train", "test", "cross")


def jsonable(value: Any) -> Any:
    """A strict-JSON copy of ``value``: NaN/inf/NA become None, numpy scalars plain Python."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    # numpy scalars and arrays, pandas NA / Timestamp, Path, ...
    if callable(getattr(value, "item", None)):
        try:
            return jsonable(value.item())
        except (TypeError, ValueError):
            pass
    if callable(getattr(value, "tolist", None)):
        return jsonable(value.tolist())
    text = str(value)
    return None if text in ("<NA>", "NaT", "nan") else text


def _tidy_number(v: Any) -> Any:
    """99.0 -> 99 for examples and bounds (a stacked frame with nulls holds floats)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def fmt_bound(x: Any) -> str:
    return str(_tidy_number(x))


def span(kwargs: dict) -> str:
    """``[min, max]`` of a between-expectation's kwargs."""
    return f"[{fmt_bound(kwargs.get('min_value'))}, {fmt_bound(kwargs.get('max_value'))}]"


def _fmt_values(values: Iterable[Any]) -> str:
    return ", ".join(map(str, values))


def _more(shown: list, total: int) -> str:
    return " ..." if total > len(shown) else ""


def counted(values: list, counts: list[dict] | None = None, show_counts: bool = True) -> str:
    """``a ×3, b ×1``: up to MAX_EXAMPLES values with how often each occurs, most frequent first
    (GX's ``partial_unexpected_counts``, exact for these values), else the example values counted.
    ``show_counts=False``: the values alone, ``a, b``."""
    pairs = [(c.get("value"), int(c.get("count") or 0)) for c in (counts or []) if "value" in c]
    if not pairs:
        seen: dict[str, list] = {}
        for v in values:
            seen.setdefault(repr(v), [v, 0])[1] += 1
        pairs = sorted(seen.values(), key=lambda p: -p[1])

    def text(v: Any) -> str:  # null for a missing value
        return "null" if v is None or (isinstance(v, float) and math.isnan(v)) else str(_tidy_number(v))

    return ", ".join(text(v) + (f" ×{n}" if show_counts else "") for v, n in pairs[:MAX_EXAMPLES])


def where(split: Any, column: Any) -> str:
    """``train.sex``, ``train`` (a table-level check) or ``train/test`` (rows in both splits)."""
    split = "train/test" if split == "cross" else str(split)
    return f"{split}.{column}" if column is not None else split


def exception_message(evr: dict) -> str | None:
    """GX records a failed metric computation per metric; return the first message."""
    info = evr.get("exception_info") or {}
    if info.get("raised_exception"):
        return str(info.get("exception_message") or "unknown error")
    for sub in info.values():
        if isinstance(sub, dict) and sub.get("raised_exception"):
            msg = str(sub.get("exception_message") or "unknown error")
            return msg.strip().splitlines()[-1] if msg.strip() else msg
    return None


def index_records(result: dict) -> list:
    """GX's unexpected index list as one entry per unexpected row: GX gives a list of row indices,
    a list of dicts (one per row), or (``exclude_unexpected_values``) one dict of parallel lists."""
    raw = result.get("unexpected_index_list")
    raw = list((raw if raw is not None else result.get("partial_unexpected_index_list")) or [])
    if len(raw) == 1 and isinstance(raw[0], dict) and all(isinstance(v, list) for v in raw[0].values()):
        return [dict(zip(raw[0], values)) for values in zip(*raw[0].values())]
    return raw


def _plural(n: int | None, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _rows_text(rows: list, count: int | None) -> str:
    more = _more(rows, count or 0)
    return f" (row{'s' if len(rows) > 1 or more else ''} {_fmt_values(rows)}{more})" if rows else ""


def _shown(values: list, counts: list | None = None) -> str:
    shown = counted(values, counts)
    return f": {shown}" if shown else ""


@dataclass(frozen=True)
class _Facts:
    """What a failed result says, read once; the wordings take their fields from here."""

    kwargs: dict
    result: dict
    column: Any
    count: int | None
    values: list   # GX's example values
    rows: list     # row positions in the split
    counts: list   # GX's partial_unexpected_counts: the examples' exact counts
    records: list  # the unexpected rows of a derived frame, one dict each
    label_column: str


def _columns(f: _Facts) -> dict:
    expected = list(f.kwargs.get("column_list") or [])
    observed = list(f.result.get("observed_value") or [])
    missing = [c for c in expected if c not in observed]
    extra = [c for c in observed if c not in expected]
    parts = [f"{label} {_fmt_values(names[:MAX_EXAMPLES])}{_more(names[:MAX_EXAMPLES], len(names))}"
             for label, names in (("missing", missing), ("unexpected", extra)) if names]
    moved: list = []
    if not missing and not extra:
        moved = [o for o, e in zip(observed, expected) if o != e]
        parts.append("out of order, first misplaced: " + _fmt_values(moved[:MAX_EXAMPLES]))
    return {"column": None, "examples": (missing + extra + moved)[:MAX_EXAMPLES],
            "detail": f"{len(observed)} columns, expected {len(expected)}: " + "; ".join(parts)}


def _exists(f: _Facts) -> dict:
    what = "label column" if f.column == f.label_column else "column"
    return {"examples": [f.column], "detail": f"no {what} {f.column!r}"}


def _row_count(f: _Facts) -> dict:
    observed = f.result.get("observed_value")
    return {"examples": [observed] if observed is not None else [],
            "detail": f"{observed} rows, expected {f.kwargs.get('min_value')}..{f.kwargs.get('max_value')}"}


def _nulls(f: _Facts) -> dict:
    return {"examples": [f"row {r}" for r in f.rows],
            "detail": _plural(f.count, "null value") + _rows_text(f.rows, f.count)}


def _in_set(f: _Facts) -> dict:
    vset = list(f.kwargs.get("value_set") or [])
    contiguous = (bool(vset) and all(isinstance(v, int) for v in vset)
                  and vset == list(range(vset[0], vset[0] + len(vset))))
    span = f"{vset[0]}..{vset[-1]}" if contiguous else _fmt_values(vset[:20]) + _more(vset[:20], len(vset))
    return _values(f, f"not in {'the class set ' if f.column == f.label_column else ''}{{{span}}}")


def _values(f: _Facts, what: str) -> dict:
    """``<n> values <what>: <the values counted> (rows ...)``."""
    return {"detail": f"{_plural(f.count, 'value')} {what}{_shown(f.values, f.counts)}"
            + _rows_text(f.rows, f.count)}


def _bad_columns(f: _Facts) -> tuple[list[dict], dict, str]:
    """The schema frame's failing rows (column, dtype, expected, found, at most MAX_EXAMPLES), the
    failure's column (the one bad column, else None) and the "..." when more failed."""
    bad = [{k: p.get(k) for k in ("column", "dtype", "expected", "found")} for p in f.records]
    if not bad:  # no index columns in the result: fall back to the values
        bad = [{"column": None, "dtype": v, "expected": None, "found": None} for v in f.values]
    return bad[:MAX_EXAMPLES], {"column": bad[0]["column"] if len(bad) == 1 else None}, _more(bad[:MAX_EXAMPLES],
                                                                                             len(bad))


def _dtype(f: _Facts) -> dict:
    bad, out, more = _bad_columns(f)
    shown = ", ".join(f"{b['column']} holds {b['found']} ({b['dtype']}), expected {b['expected']}" for b in bad)
    return {**out, "examples": bad, "detail": f"{_plural(f.count, 'column')} of the wrong type: {shown}{more}"}


def _feature_type(f: _Facts) -> dict:
    bad, out, more = _bad_columns(f)
    shown = ", ".join(f"{b['column']} is {b['dtype']}" for b in bad)
    return {**out, "examples": [{"column": b["column"], "dtype": b["dtype"]} for b in bad],
            "detail": f"{_plural(f.count, 'feature column')} of a type a model cannot take (numbers, "
                      f"text or booleans): {shown}{more}"}


def _class_balance(f: _Facts) -> dict:
    shares = [{"label": p.get("label"), "fraction": round(float(p["fraction"]), 4)}
              for p in f.records if isinstance(p.get("fraction"), (int, float))][:MAX_EXAMPLES]
    shown = ", ".join(f"{e['label']} ({e['fraction']:.3f})" for e in shares)
    return {"column": f.label_column, "examples": shares or f.values,
            "detail": f"{_plural(f.count, 'class', 'classes')} with a share outside {span(f.kwargs)}"
                      + (f": {shown}" if shown else "")}


def _leak(f: _Facts) -> dict:
    by_hash: dict[Any, dict[str, list]] = {}
    for p in f.records:
        by_hash.setdefault(p.get("row_hash"), {}).setdefault(str(p.get("split")), []).append(p.get("row"))
    pairs = [{"train_row": sides.get("train", [None])[0], "test_row": sides.get("test", [None])[0]}
             for sides in by_hash.values()]
    # Without the index list, each leaked row counts twice (once per split).
    n_rows = len(by_hash) if by_hash else (f.count or 0) // 2
    shown = ", ".join(f"train[{p['train_row']}] = test[{p['test_row']}]" for p in pairs[:MAX_EXAMPLES])
    return {"column": None, "examples": pairs[:MAX_EXAMPLES],
            "detail": f"{_plural(n_rows, 'row')} of test also in train"
                      + (f": {shown}{_more(pairs[:MAX_EXAMPLES], len(pairs))}" if shown else "")}


@dataclass(frozen=True)
class _Wording:
    """How a failed expectation reads: its check name, the fields it words, and whether it keeps
    the row positions (a table-level check or a derived frame's has no split rows to show)."""

    check: str
    word: Callable[[_Facts], dict]  # -> "detail" and any field it sets ("examples", "column")
    rows: bool = True
    label_check: str | None = None  # the check's name when its column is the label


# (frame the result came from, expectation type) -> its wording. The frame is part of the key
# because a derived frame's rows are not data rows: a value set on the schema frame is the
# features' kinds, a range on the balance frame the classes' shares.
_WORDING: dict[tuple[str, str], _Wording] = {
    ("split", "expect_table_columns_to_match_ordered_list"): _Wording("columns", _columns, rows=False),
    ("split", "expect_column_to_exist"): _Wording("columns", _exists, rows=False, label_check="label_column"),
    ("split", "expect_table_row_count_to_be_between"): _Wording("row_count", _row_count, rows=False),
    ("split", "expect_column_values_to_not_be_null"): _Wording("nulls", _nulls),
    ("split", "expect_column_values_to_be_in_set"): _Wording("value_set", _in_set, label_check="label_set"),
    ("split", "expect_column_values_to_be_between"): _Wording("range", lambda f: _values(
        f, f"outside {span(f.kwargs)}")),
    ("split", "expect_column_values_to_match_strftime_format"): _Wording("date_format", lambda f: _values(
        f, f"not a date of format {f.kwargs.get('strftime_format')!r}")),
    ("schema", "expect_column_pair_values_to_be_in_set"): _Wording("dtype", _dtype, rows=False),
    ("schema", "expect_column_values_to_be_in_set"): _Wording("feature_type", _feature_type, rows=False),
    ("balance", "expect_column_values_to_be_between"): _Wording("class_balance", _class_balance, rows=False),
    ("cross", "expect_column_values_to_be_unique"): _Wording("leak", _leak, rows=False),
}


def failure_from_result(evr: dict, split: str, frame: str = "split", *, label_column: str = "label") -> dict:
    """One failure entry from a failed ExpectationValidationResult (JSON dict form).

    ``split``: the report's split ("train", "test", "cross"). ``frame``: the frame the result
    came from: "split" (the data itself), "schema", "balance" or "cross" (see ``validation.suite``).
    An expectation with no wording in :data:`_WORDING` is check "other": its count, examples and
    rows as GX gives them.
    """
    config = evr.get("expectation_config") or {}
    etype = config.get("type") or "unknown"
    kwargs = config.get("kwargs") or {}
    result = evr.get("result") or {}
    count = result.get("unexpected_count")
    index_list = index_records(result)
    facts = _Facts(
        kwargs=kwargs, result=result, column=kwargs.get("column"), count=int(count) if count is not None else None,
        values=list(result.get("partial_unexpected_list") or [])[:MAX_EXAMPLES],
        rows=[i for i in index_list if isinstance(i, int) and not isinstance(i, bool)][:MAX_EXAMPLES],
        counts=[c for c in (result.get("partial_unexpected_counts") or []) if isinstance(c, dict)],
        records=[p for p in index_list if isinstance(p, dict)], label_column=label_column)
    failure: dict[str, Any] = {
        "split": split, "check": "other", "expectation": etype, "column": facts.column,
        "unexpected_count": facts.count, "examples": facts.values, "rows": facts.rows,
        "detail": _plural(facts.count, "unexpected value") if facts.count is not None else "failed",
    }
    wording = _WORDING.get((frame, etype))
    if wording is not None:
        is_label = wording.label_check is not None and facts.column == label_column
        failure["check"] = wording.label_check if is_label else wording.check
        if not wording.rows:
            failure["rows"] = []
        failure.update(wording.word(facts))
    error = exception_message(evr)
    if error is not None:  # GX could not evaluate it (e.g. the column is missing, or holds strings)
        failure.update(unexpected_count=None, examples=[], rows=[], detail=f"could not be evaluated: {error}")
    failure["message"] = f"{where(split, failure['column'])}: {failure['detail']}"
    return jsonable(failure)


def _cells_values(group: list[dict], count: int) -> str:
    """``: -1 ×3, 99 ×1`` when every failing cell of the column is listed (counts exact), else the
    distinct values among the first ``CELLS_COUNTED``, most frequent first: ``, e.g. -1, 99``."""
    values = [_tidy_number(c.get("value")) for c in group[:CELLS_COUNTED]]
    if len(values) >= count:
        return f": {counted(values)}"
    return ", e.g. " + counted(values, show_counts=False)


def cells_failures(evr: dict, split: str) -> list[dict]:
    """Per-column failures from a stacked-cells result (``validation.suite``'s cells frame).

    GX's COMPLETE result lists every unexpected cell (index names prefixed ``cell_``); they are
    grouped by column so each column gets its own entry with its exact count and its own bound
    (the range checks are GX pair expectations: ``value >= min``, column_A "value", and ``max >=
    value``). A result GX could not evaluate, or one without the cell list, is one entry with
    column None.
    """
    config = evr.get("expectation_config") or {}
    kwargs = config.get("kwargs") or {}
    side = None
    if config.get("type") == "expect_column_pair_values_a_to_be_greater_than_b":
        side = "min" if kwargs.get("column_A") == "value" else "max"
    base = failure_from_result(evr, split, "split")
    if side is not None:
        base["check"] = "range"
    result = evr.get("result") or {}
    cells = [p for p in index_records(result) if isinstance(p, dict)]
    if base["detail"].startswith("could not be evaluated") or not cells:
        # The stacked frame's own column ("value") means nothing to a reader: no column.
        base.update(column=None, rows=[], message=f"{where(split, None)}: {base['detail']}")
        return [base]
    by_column: dict[Any, list[dict]] = {}
    for cell in cells:
        cell = {k.removeprefix("cell_"): v for k, v in cell.items()}
        by_column.setdefault(cell.get("column"), []).append(cell)
    # A result merged from batches lists at most CELLS_COUNTED cells a column, with its exact count.
    exact = result.get(BY_GROUP) or {}
    out = []
    for column, group in by_column.items():
        count = int(exact.get(str(column), len(group)))
        rows = [c.get("row") for c in group[:MAX_EXAMPLES]]
        f = dict(base, column=column, unexpected_count=count, rows=rows,
                 examples=[_tidy_number(c.get("value")) for c in group[:MAX_EXAMPLES]])
        if base["check"] == "nulls":
            f.update(examples=[f"row {r}" for r in rows], detail=_plural(count, "null value"))
        elif side is not None:
            f["detail"] = (f"{_plural(count, 'value')} {'below min' if side == 'min' else 'above max'} "
                           f"{fmt_bound(group[0].get(side))}{_cells_values(group, count)}")
        else:
            f["detail"] = f"{_plural(count, 'value')} outside {span(kwargs)}{_cells_values(group, count)}"
        f["detail"] += _rows_text(rows, count)
        f["message"] = f"{where(split, column)}: {f['detail']}"
        out.append(jsonable(f))
    return out


def failures_from_results(results: Iterable[tuple[str, str, dict]], *, label_column: str = "label") -> list[dict]:
    """Failure entries for every unsuccessful result among ``(split, frame, evr)`` triples: one per
    failed expectation, except stacked-cells results: one per failing column."""
    out: list[dict] = []
    for split, frame, evr in results:
        if evr.get("success"):
            continue
        if frame == "cells":
            out += cells_failures(evr, split)
        else:
            out.append(failure_from_result(evr, split, frame, label_column=label_column))
    return out


_TABLE_CHECKS = ("columns", "label_column", "row_count", "dtype", "feature_type")
_COLUMN_CHECKS = ("nulls", "range", "label_set", "value_set", "date_format", "other")
_CHECK_ORDER = (*_TABLE_CHECKS, *_COLUMN_CHECKS, "class_balance", "leak")


def sort_failures(failures: list[dict], columns: list[str]) -> list[dict]:
    """Split order, then table checks, then per column in ``columns`` order, then balance, leak."""
    col_rank = {c: i for i, c in enumerate(columns)}

    def key(f: dict) -> tuple:
        check = f.get("check", "other")
        group = 0 if check in _TABLE_CHECKS else (1 if check in _COLUMN_CHECKS else 2)
        return (SPLIT_ORDER.index(f["split"]) if f.get("split") in SPLIT_ORDER else len(SPLIT_ORDER), group,
                col_rank.get(f.get("column"), len(col_rank)) if group == 1 else 0,
                _CHECK_ORDER.index(check) if check in _CHECK_ORDER else len(_CHECK_ORDER))

    return sorted(failures, key=key)


def _cell(value: Any) -> str:
    return printable("" if value is None else value).replace("|", "\\|")


def _example_text(example: Any, limit: int = 40) -> str:
    if isinstance(example, dict):
        text = "{" + ", ".join(f"{k}: {v}" for k, v in example.items()) + "}"
    else:
        text = "null" if example is None else str(example)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summary_markdown(report: dict) -> str:
    """A markdown summary of a report: a pass/fail headline and one table row per failure."""
    failures = list(report.get("failures") or [])
    n_exp = report.get("n_expectations", 0)
    n_failed = report.get("n_failed", len(failures))
    gx_counts = report.get("gx") or {}
    extra = []
    if gx_counts.get("expectations") is not None:
        extra.append(f"{gx_counts['expectations']} GX expectations, {gx_counts.get('failed', 0)} failed")
    if isinstance(report.get("duration_s"), (int, float)):
        extra.append(f"{report['duration_s']:.2f} s")
    lines = [f"# Data validation {'PASSED' if report.get('success') else 'FAILED'}", "",
             f"{max(n_exp - n_failed, 0)} of {n_exp} checks passed, {n_failed} failed"
             + (f" ({'; '.join(extra)})" if extra else "") + "."]
    rows = report.get("rows")
    if isinstance(rows, dict) and rows:
        lines += ["", "Rows: " + ", ".join(f"{k} {v}" for k, v in rows.items()) + "."]
    if failures:
        lines += ["", "## What failed", "", *(f"- {printable(f.get('message') or f.get('detail'))}" for f in failures),
                  "", "## Failures", "", "| split | check | expectation | column | unexpected | examples | detail |",
                  "|---|---|---|---|---:|---|---|"]
        for f in failures:
            examples = "; ".join(_example_text(e) for e in (f.get("examples") or [])[:MAX_EXAMPLES])
            count, column = f.get("unexpected_count"), f.get("column")
            cells = (f.get("split"), f.get("check", ""), f"`{f.get('expectation')}`",
                     column if column is not None else "—", count if count is not None else "—",
                     examples, f.get("detail", ""))
            lines.append("| " + " | ".join(_cell(v) for v in cells) + " |")
    warnings = report.get("warnings") or []
    if warnings:
        lines += ["", "## Warnings (reported, not failed)", "", *(f"- {printable(w.get('message') or w.get('detail'))}"
                                                                   for w in warnings)]
    skipped = report.get("skipped") or []
    if skipped:
        lines += ["", "## Checks not run", "", *(printable(f"- {s.get('split')}: {s.get('check')}: {s.get('reason')}")
                                                 for s in skipped)]
    files = report.get("files") or {}
    if files:
        lines += ["", "## Files", "", *(f"- {k}: {files[k] if files[k] is not None else 'not built'}"
                                        for k in ("result_json", "summary_md", "data_docs") if k in files)]
    return "\n".join(lines) + "\n"
