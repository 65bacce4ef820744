"""A table's feature columns as a model's input, torch-free: fitted on the train split in one
bounded-memory pass (:class:`TableFit`), applied to any frame (:func:`encode`) as float32.

* **categorical** (string, boolean, or named in ``dataset.categorical``): values compare by their
  text form (:func:`category_keys`); the vocabulary is the train split's ``max_categories`` most
  frequent values, a value encoded as ``FIRST_CODE + its index``, a missing one as ``MISSING_CODE``,
  any other as ``OTHER_CODE``. The registered pyfunc (``tasks/pyfunc_table.py``) encodes the same way.
* **numeric**: the value itself (NaN where missing), with the statistics ``tasks.table_nets.TableInput``
  maps it by (quantiles from a reservoir of ``SAMPLE_ROWS`` values, median, IQR, mean, std).
* **date** (named in ``dataset.dates`` with its strftime format): the text parsed with that format
  and turned into numeric parts (:func:`date_parts`), each a fitted column of its own named
  ``<column>.<part>`` with ``source``, ``part`` and ``format``; a value that does not parse counts
  as missing (validation names such values before training). The pyfunc does the same.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Iterable

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

MISSING_CODE, OTHER_CODE, FIRST_CODE = 0, 1, 2
QUANTILE_KNOTS = 64  # quantile probabilities fitted per numeric column (0, 1/(K-1), ..., 1)
SAMPLE_ROWS = 65536  # values kept per numeric column for its quantiles (a seeded reservoir sample)
SCORE_CLIP = 1e-3  # the quantiles' normal scores are cut at these probabilities (+-3.09 sd)
CATEGORICAL_TYPES = ("string", "boolean")


def tracked(max_categories: int) -> int:
    """Distinct values a categorical column's counts hold before the rarest are dropped."""
    return max(20 * max_categories, 10000)


def _text(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    if isinstance(v, (float, np.floating)) and float(v).is_integer() and abs(v) < 2**53:
        return str(int(v))
    return str(v)


def category_keys(values: "pd.Series") -> np.ndarray:
    """Each value's text form (object array; None where missing): how categories compare (3, 3.0
    and "3" are one category; booleans as ``"True"``/``"False"``)."""
    import pandas as pd

    s = values if isinstance(values, pd.Series) else pd.Series(values)
    missing = s.isna().to_numpy()
    if pd.api.types.is_bool_dtype(s.dtype):
        out = np.where(s.to_numpy(dtype=bool, na_value=False), "True", "False").astype(object)
    elif pd.api.types.is_numeric_dtype(s.dtype):
        v = s.to_numpy(dtype="float64", na_value=np.nan)
        whole = np.isfinite(v) & (np.abs(v) < 2**53)
        whole[whole] = v[whole] == np.round(v[whole])
        out = v.astype(str).astype(object)
        out[whole] = v[whole].astype(np.int64).astype(str)
    elif pd.api.types.is_string_dtype(s.dtype) and not pd.api.types.is_object_dtype(s.dtype):
        out = s.to_numpy(dtype=object, na_value=None)
    else:
        out = s.map(_text, na_action="ignore").to_numpy(dtype=object)
    out[missing] = None
    return out


def category_codes(values: "pd.Series", vocabulary: list[str]) -> np.ndarray:
    """float32 codes of ``values`` against a vocabulary of text forms (see the module docstring)."""
    import pandas as pd

    keys = category_keys(values)
    index = pd.Index(vocabulary, dtype=object).get_indexer(keys) if vocabulary else np.full(len(keys), -1)
    codes = np.where(index >= 0, index + FIRST_CODE, OTHER_CODE).astype(np.float32)
    codes[pd.isna(keys)] = MISSING_CODE
    return codes


# The numeric parts a date column becomes: calendar fields, the hour (formats with one), the days
# since 1970-01-01 (with the time of day as a fraction: the trend an unseen later date continues),
# and 1.0 where the value is missing or does not parse.
DATE_PARTS = ("year", "month", "day", "weekday", "dayofyear", "hour", "days", "missing")


def date_columns(name: str, fmt: str, parts) -> list[str]:
    """The parts a date column ``name`` of format ``fmt`` becomes (no hour in a format without one)."""
    return [p for p in DATE_PARTS if p in parts and (p != "hour" or "%H" in fmt or "%I" in fmt)]


# The formats init recognises, most specific first; where two fit a column equally (01/02/2016:
# month first or day first) the column is ambiguous and left as text.
DATE_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d",
                "%Y/%m/%d", "%m/%d/%Y %H:%M:%S", "%m/%d/%Y %H:%M", "%m/%d/%Y", "%d/%m/%Y %H:%M:%S", "%d/%m/%Y %H:%M",
                "%d/%m/%Y", "%d.%m.%Y %H:%M:%S", "%d.%m.%Y %H:%M", "%d.%m.%Y")
# Share of a column's distinct non-null values that must parse for init to call it a date column.
DATE_SHARE = 0.95
DATE_SAMPLE = 5000  # distinct values init tries each format on


def detect_date_format(values: "pd.Series") -> tuple[str | None, str]:
    """``(format, why)`` of a text column of dates or timestamps (format None: not one, or ambiguous),
    from its distinct non-null values (up to ``DATE_SAMPLE``); ``why`` says what was found."""
    import pandas as pd

    s = values.dropna()
    if not len(s) or numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype):
        return None, "not text"
    distinct = pd.Series(pd.unique(s.astype(str))[:DATE_SAMPLE], dtype="string")
    parsed = {fmt: int(pd.to_datetime(distinct, format=fmt, errors="coerce").notna().sum()) for fmt in DATE_FORMATS}
    best = max(parsed.values())
    if best < DATE_SHARE * len(distinct):
        return None, "not dates"
    fits = [fmt for fmt, n in parsed.items() if n == best]
    # A format and its extension by seconds or minutes both fit nothing else; the day-first and
    # month-first readings both fitting every value is the ambiguity.
    if any(a.startswith("%m") for a in fits) and any(b.startswith("%d") for b in fits):
        return None, f"dates, but month/day order is ambiguous ({fits[0]} or {fits[-1]})"
    fmt = fits[0]
    bad = len(distinct) - best
    return fmt, (f"{len(distinct)} distinct values in format {fmt}" + (f" ({bad} do not parse)" if bad else ""))


def date_parts(values: "pd.Series", fmt: str) -> dict[str, np.ndarray]:
    """``{part: float64 array}`` of every ``DATE_PARTS`` entry of ``values`` parsed with ``fmt`` (NaN where
    the date is missing or not in that format, but ``missing`` itself, 1.0 there)."""
    import pandas as pd

    t = values if isinstance(values, pd.Series) else pd.Series(values)
    if not pd.api.types.is_datetime64_any_dtype(t.dtype):
        t = pd.to_datetime(t.astype("string"), format=fmt, errors="coerce")
    dt = t.dt
    days = (t - np.datetime64("1970-01-01")).dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan) / 86400
    out = {"year": dt.year, "month": dt.month, "day": dt.day, "weekday": dt.dayofweek, "dayofyear": dt.dayofyear,
           "hour": dt.hour}
    out = {k: v.to_numpy(dtype=np.float64, na_value=np.nan) for k, v in out.items()}
    out["days"] = days
    out["missing"] = np.isnan(days).astype(np.float64)
    return out


def numeric_values(values: "pd.Series", name: str, dtype=np.float32) -> np.ndarray:
    """The values of a numeric column as ``dtype`` (NaN where missing); ValueError naming a column
    that holds text."""
    try:
        return values.to_numpy(dtype=np.float64, na_value=np.nan).astype(dtype, copy=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"feature column {name!r} must be numeric (it is not categorical): {exc}") from None


def encode(frame: "pd.DataFrame", columns: list[dict]) -> np.ndarray:
    """float32 ``[rows, len(columns)]``: each fitted column of ``frame``, numeric values as they are
    and categories as codes. ValueError naming a missing column or text in a numeric one."""
    missing = list(dict.fromkeys(c.get("source", c["name"]) for c in columns
                                 if c.get("source", c["name"]) not in frame.columns))
    if missing:
        raise ValueError(f"missing feature column(s) {missing[:5]}; the frame has {list(frame.columns)[:10]}")
    out = np.empty((len(frame), len(columns)), dtype=np.float32)
    dates: dict[str, dict] = {}  # a date column parsed once for all its parts
    for j, c in enumerate(columns):
        if "source" in c:
            if c["source"] not in dates:
                dates[c["source"]] = date_parts(frame[c["source"]], c["format"])
            out[:, j] = dates[c["source"]][c["part"]]
            continue
        s = frame[c["name"]]
        out[:, j] = (category_codes(s, c["values"]) if c["kind"] == "categorical"
                     else numeric_values(s, c["name"]))
    return out


def column_kinds(features: list[str], types: dict[str, str], categorical: Iterable[str] = (),
                 dates: Iterable[str] = ()) -> dict[str, str]:
    """``{feature: "categorical" | "numeric" | "date"}``: date for a column named in ``dates``,
    categorical for a string or boolean expectations type (``types``) or a column named in ``categorical``."""
    named, dated = set(categorical), set(dates)
    return {f: "date" if f in dated else "categorical" if f in named or types.get(f) in CATEGORICAL_TYPES
            else "numeric" for f in features}


def numeric_dtype(dtype) -> bool:
    """A numeric dtype that is not boolean."""
    import pandas as pd

    return pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)


class _Numeric:
    """Count, nulls, mean and m2 (Chan's merge), min, max and a seeded reservoir sample."""

    def __init__(self, name: str, rng: np.random.Generator):
        self.name, self.rng = name, rng
        self.count = self.nulls = self.seen = 0
        self.mean = self.m2 = 0.0
        self.min = self.max = None
        self.sample = np.empty(0, dtype=np.float64)

    def update(self, s: "pd.Series") -> None:
        v = numeric_values(s, self.name, np.float64)  # statistics in float64, not the model's float32
        finite = np.isfinite(v)
        self.nulls += int(np.isnan(v).sum())
        v = v[finite]
        if not len(v):
            return
        n, m = self.count + len(v), float(v.mean())
        d = v - m
        delta = m - self.mean
        self.m2 += float(d @ d) + delta * delta * self.count * len(v) / n
        self.mean += delta * len(v) / n
        self.count = n
        lo, hi = float(v.min()), float(v.max())
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)
        self._reservoir(v)

    def _reservoir(self, v: np.ndarray) -> None:
        """Algorithm R, vectorised: value t (0-based) of the stream replaces slot j ~ U{0..t} when
        j < SAMPLE_ROWS (later ones win, as one at a time)."""
        room = SAMPLE_ROWS - len(self.sample)
        if room > 0:
            self.sample = np.concatenate([self.sample, v[:room]])
            self.seen += min(room, len(v))
            v = v[room:]
        if len(v):
            t = self.seen + np.arange(len(v), dtype=np.float64)
            j = np.floor(self.rng.random(len(v)) * (t + 1)).astype(np.int64)
            keep = j < SAMPLE_ROWS
            self.sample[j[keep]] = v[keep]
            self.seen += len(v)

    def result(self) -> dict:
        std = math.sqrt(self.m2 / self.count) if self.count else 0.0
        knots, scores = quantile_knots(self.sample)
        if len(self.sample):
            q1, median, q3 = (float(x) for x in np.quantile(self.sample, [0.25, 0.5, 0.75]))
        else:
            q1 = median = q3 = 0.0
        return {"name": self.name, "kind": "numeric", "count": self.count, "nulls": self.nulls,
                "mean": self.mean if self.count else 0.0, "std": std if std > 0 else 1.0,
                "min": self.min, "max": self.max, "median": median,
                "iqr": (q3 - q1) if q3 > q1 else (std if std > 0 else 1.0),
                "knots": knots, "scores": scores}


def quantile_knots(sample: np.ndarray, k: int = QUANTILE_KNOTS) -> tuple[list[float], list[float]]:
    """(knots, normal scores) of a piecewise-linear quantile transform: the sample's quantiles at ``k``
    probabilities and the standard normal's there (cut at ``SCORE_CLIP``). A value repeated across
    quantiles (many zeros) is one knot scored by their mean, the middle of its share. No values: 0 -> 0."""
    if not len(sample):
        return [0.0], [0.0]
    probs = np.linspace(0.0, 1.0, k)
    q = np.quantile(sample, probs)
    dist = NormalDist()
    z = np.array([dist.inv_cdf(min(max(p, SCORE_CLIP), 1 - SCORE_CLIP)) for p in probs])
    knots, inverse = np.unique(q, return_inverse=True)
    scores = np.bincount(inverse, weights=z) / np.bincount(inverse)
    if len(knots) == 1:
        scores = np.zeros(1)
    return knots.tolist(), scores.tolist()


class _Categorical:
    """Counts of each value's text form, at most ``tracked`` of them (the rarest dropped beyond)."""

    def __init__(self, name: str, max_categories: int):
        self.name, self.max_categories = name, max_categories
        self.counts: dict[str, int] = {}
        self.count = self.nulls = 0
        self.pruned = False

    def update(self, s: "pd.Series") -> None:
        import pandas as pd

        keys = category_keys(s)
        missing = pd.isna(keys)
        self.nulls += int(missing.sum())
        present = keys[~missing]
        self.count += len(present)
        if not len(present):
            return
        values, counts = np.unique(present.astype(str), return_counts=True)
        for v, n in zip(values.tolist(), counts.tolist()):
            self.counts[v] = self.counts.get(v, 0) + n
        limit = tracked(self.max_categories)
        if len(self.counts) > limit:
            keep = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[: limit // 2]
            self.counts, self.pruned = dict(keep), True

    def result(self) -> dict:
        top = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[: self.max_categories]
        kept = sum(n for _, n in top)
        return {"name": self.name, "kind": "categorical", "count": self.count, "nulls": self.nulls,
                "values": sorted(v for v, _ in top), "other": self.count - kept,
                "distinct": len(self.counts), "approximate": self.pruned}


class _Date:
    """A date column's parts, each folded into a numeric column of its own."""

    def __init__(self, name: str, fmt: str, parts, rng: np.random.Generator):
        self.name, self.fmt = name, fmt
        self.parts = {p: _Numeric(f"{name}.{p}", rng) for p in date_columns(name, fmt, parts)}

    def update(self, s: "pd.Series") -> None:
        import pandas as pd

        values = date_parts(s, self.fmt)
        for p, part in self.parts.items():
            part.update(pd.Series(values[p]))

    def result(self) -> list[dict]:
        return [{**part.result(), "source": self.name, "part": p, "format": self.fmt} for p, part in self.parts.items()]


class TableFit:
    """Fold train-split frames (:meth:`update`) into the fitted columns (:meth:`columns`). ``kinds``:
    ``{feature: "numeric" | "categorical" | "date"}`` in feature order; ``dates``: ``{column: format}``
    and ``date_parts`` the parts a date becomes; ``seed`` seeds the numeric reservoirs."""

    def __init__(self, kinds: dict[str, str], max_categories: int, seed: int = 0, dates: dict[str, str] | None = None,
                 date_parts: Iterable[str] = DATE_PARTS):
        rng = np.random.default_rng([seed, 0x7AB])
        dates, date_parts = dates or {}, tuple(date_parts)
        self.parts = {name: (_Categorical(name, max_categories) if kind == "categorical"
                             else _Date(name, dates[name], date_parts, rng) if kind == "date" else _Numeric(name, rng))
                      for name, kind in kinds.items()}

    def update(self, frame: "pd.DataFrame") -> None:
        for name, part in self.parts.items():
            part.update(frame[name])

    def columns(self) -> list[dict]:
        """One JSON-able dict per encoded column, in order: ``name``, ``kind``, ``count``, ``nulls``,
        statistics (a date column gives one numeric column per part, see the module docstring)."""
        out = []
        for part in self.parts.values():
            r = part.result()
            out += r if isinstance(r, list) else [r]
        return out


def fit_columns(frames: Iterable["pd.DataFrame"], kinds: dict[str, str], max_categories: int,
                seed: int = 0, dates: dict[str, str] | None = None, date_parts: Iterable[str] = DATE_PARTS) -> list[dict]:
    """:meth:`TableFit.columns` over ``frames`` (one whole split, or its batches in order)."""
    fit = TableFit(kinds, max_categories, seed, dates, date_parts)
    for frame in frames:
        fit.update(frame)
    return fit.columns()
