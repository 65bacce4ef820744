"""Profile a table into the content of its expectations file (``core.expectations``).

``trainflow init`` profiles the data the user brings once; the user reviews and commits the file,
and validation checks every later data version against it. The bounds are the data seen, widened
a little: tight enough to catch a broken export (other units, a flipped sign, a lost class, half
the rows), loose enough that the next honest version of the data still passes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from core.expectations import ColumnExpectation, TableExpectations

if TYPE_CHECKING:
    import pandas as pd

# A string column with at most this many distinct values is categorical: its values are listed.
MAX_CATEGORIES = 20
# Row counts a split may have relative to the profiled one: [floor(n / ROWS_FACTOR), n * ROWS_FACTOR].
# Data versions usually grow (appended rows) or are re-split; half or double is a change big
# enough that a person should look (a truncated export, a duplicated append) before training.
ROWS_FACTOR = 2


def profile_table(frames: dict[str, "pd.DataFrame"], label: str, classification: bool,
                  margin: float = 0.1, categorical: tuple[str, ...] = (), dates: tuple[str, ...] = ()) -> TableExpectations:
    """The expectations of a table: one entry per column (in file order), row counts per split,
    and for classification the class set and the range of a class's share of a split.

    ``frames``: ``{"train": df, "test": df}`` (either may be missing) as the files hold them.
    ``margin``: numeric bounds are widened by ``margin`` x the column's range on each side,
    class shares by ``margin`` x the share. ``categorical``: numeric columns the model takes as
    categories: their values are listed too (as a few-valued text column's are). ``dates``: text
    columns of dates: no value set (a later data version brings new dates). Raises
    ValueError when the label is not a column.
    """
    import pandas as pd

    unknown = sorted(set(frames) - {"train", "test"})
    if unknown or not frames:
        raise ValueError(f"frames: expected the splits 'train' and/or 'test', got {sorted(frames)}")
    if margin < 0:
        raise ValueError(f"margin: must be >= 0, got {margin}")
    names: list[str] = []
    for df in frames.values():
        names += [str(c) for c in df.columns if str(c) not in names]
    if label not in names:
        raise ValueError(f"label: {label!r} is not a column; the columns are {names}")
    both = pd.concat([df.rename(columns=str) for df in frames.values()], ignore_index=True)
    columns = [_column(name, both[name], margin, categorical=classification and name == label,
                       listed=name in categorical, dated=name in dates) for name in names]
    rows = {split: (len(df) // ROWS_FACTOR, len(df) * ROWS_FACTOR) for split, df in frames.items()}
    share = _class_share([df[label] for df in frames.values() if label in df.columns], margin) \
        if classification else None
    return TableExpectations(label=label, columns=columns, rows=rows, class_share=share)


def column_type(values: "pd.Series") -> str:
    """integer | float | string | boolean of a column's non-null values (integer: all whole numbers)."""
    import pandas as pd

    s = values.dropna()
    if pd.api.types.is_bool_dtype(values.dtype) or (len(s) and s.map(lambda v: isinstance(v, bool)).all()):
        return "boolean"
    if pd.api.types.is_numeric_dtype(values.dtype):
        if pd.api.types.is_integer_dtype(values.dtype):
            return "integer"
        # An integer column with a missing value reads as float (NaN); whole numbers say integer.
        return "integer" if len(s) and bool((s == s.round()).all()) and bool(s.abs().max() < 2**53) else "float"
    return "string"


def _column(name: str, values: "pd.Series", margin: float, categorical: bool,
            listed: bool = False, dated: bool = False) -> ColumnExpectation:
    """``categorical``: the classification label (its values, no bounds); ``listed``: a numeric
    column taken as categories (its values and its bounds)."""
    ctype = column_type(values)
    s = values.dropna()
    spec: dict[str, Any] = {"name": name, "type": ctype, "nulls": bool(values.isna().any())}
    if ctype in ("integer", "float") and len(s) and not categorical:
        lo, hi = float(s.min()), float(s.max())
        if math.isfinite(lo) and math.isfinite(hi):  # an infinity seen: no bound would hold it
            spec["min"], spec["max"] = _bounds(lo, hi, margin, integer=ctype == "integer")
    if len(s) and (categorical or listed or (ctype == "string" and not dated and s.nunique() <= MAX_CATEGORIES)):
        spec["values"] = _sorted_values(s, ctype)
    return ColumnExpectation(**spec)


def _bounds(lo: float, hi: float, margin: float, integer: bool) -> tuple[float, float]:
    """[lo, hi] widened by margin x range on each side (by margin x |value|, at least margin, when
    the column is constant), rounded outward: integers to whole numbers, floats to two significant
    digits of the widening."""
    pad = margin * (hi - lo) if hi > lo else margin * max(abs(lo), 1.0)
    a, b = lo - pad, hi + pad
    if integer:
        a, b = math.floor(a), math.ceil(b)
    elif pad > 0:
        digits = 1 - math.floor(math.log10(pad))
        step = 10.0 ** -digits
        a, b = round(_floor(a / step) * step, max(digits, 0)), round(_ceil(b / step) * step, max(digits, 0))
        a, b = min(a, lo), max(b, hi)  # the rounding of the float grid must not cut into the data
    # A column that never went below zero is a count, an amount, a concentration, a duration:
    # a negative value is an error (a sign flip, a -1 "missing" code), so the widening stops at 0.
    if lo >= 0 > a:
        a = 0
    return a, b


def _sorted_values(s: "pd.Series", ctype: str) -> list[Any]:
    """The distinct values, sorted, as plain YAML scalars (integer labels as ints)."""
    cast = {"integer": lambda v: int(v), "float": float, "boolean": bool}.get(ctype, str)
    return sorted({cast(v) for v in s.tolist()})


def _class_share(labels: list["pd.Series"], margin: float) -> tuple[float, float] | None:
    """[smallest, largest] share of any class in any split (a class a split lacks counts as 0),
    widened by margin x share on each side, rounded outward to 3 decimals, within [0, 1]."""
    splits = [s.dropna().astype(str) for s in labels]
    classes = set().union(*(set(s) for s in splits))
    shares = []
    for s in splits:
        if len(s):
            counts = s.value_counts()
            shares += [int(counts.get(c, 0)) / len(s) for c in classes]
    if not shares:
        return None
    lo, hi = min(shares) * (1 - margin), max(shares) * (1 + margin)
    return max(0.0, _floor(lo * 1000) / 1000), min(1.0, _ceil(hi * 1000) / 1000)


# floor / ceil that ignore float noise: 0.75 * 1.1 * 1000 is 825.0000000000001, not above 825.
def _floor(x: float) -> int:
    return math.floor(round(x, 9))


def _ceil(x: float) -> int:
    return math.ceil(round(x, 9))
