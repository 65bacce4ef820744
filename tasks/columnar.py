"""Tables read in bounded memory, torch- and pandas-free: Arrow record batches of a Parquet file,
a folder of them or a CSV file (:func:`iter_batches`, one row group or CSV block at a time), and
per-column statistics merged across them (:class:`ColumnStats`; NaN counts as a null)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import DataUnavailableError
from tasks.bounds import check_batch_cells, check_names, check_table

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = ["BATCH_ROWS", "ColumnStats", "iter_batches", "parquet_files", "source_format", "source_rows",
           "source_schema"]

BATCH_ROWS = 65536  # rows per batch when the caller does not say
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_BLOCK_BYTES = 8 << 20  # bytes per streaming CSV block (parsed whole, then sliced into batches)


def source_format(source: Path) -> str:
    """``"parquet"`` (a file or a folder of Parquet files) or ``"csv"``; DataUnavailableError otherwise."""
    source = Path(source)
    if source.is_dir():
        return "parquet"
    suffix = source.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise DataUnavailableError(f"{source}: unknown table format {suffix!r}; use .csv, .parquet or a folder "
                               "of .parquet files")


def parquet_files(source: Path) -> list[Path]:
    """The Parquet files of ``source`` in reading order: the file itself, or a folder's ``*.parquet`` /
    ``*.pq`` files (not recursive) sorted by name. DataUnavailableError when there are none."""
    source = Path(source)
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise DataUnavailableError.not_pulled(source)
    files = sorted(p for p in source.iterdir() if p.is_file() and p.suffix.lower() in PARQUET_SUFFIXES)
    if not files:
        raise DataUnavailableError(f"{source}: a folder with no .parquet files")
    return files


def source_rows(source: Path) -> int | None:
    """Rows of a Parquet source from its footers (no data read); None for a CSV (unknown until read)."""
    if source_format(source) != "parquet":
        return None
    return sum(_parquet(path).metadata.num_rows for path in parquet_files(source))


def iter_batches(source: Path, columns: list[str] | None = None, batch_rows: int = BATCH_ROWS,
                 types: dict[str, Any] | None = None) -> Iterator[pa.RecordBatch]:
    """``pyarrow.RecordBatch`` objects of at most ``batch_rows`` rows of ``columns`` (None: all), lazily.
    A CSV's types come from its first block, integer and all-null columns widened to float64;
    ``types`` (``{column: pyarrow type}``) forces some. DataUnavailableError for a missing or
    unreadable file, a missing column, or a later CSV value that does not convert."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows: must be >= 1, got {batch_rows}")
    source = Path(source)
    if source_format(source) == "csv":
        yield from _csv_batches(source, columns, batch_rows, types or {})
        return
    for path in parquet_files(source):
        yield from _parquet_batches(path, columns, batch_rows)


def _parquet(path: Path, columns: list[str] | None = None):
    """``pyarrow.parquet.ParquetFile`` of ``path``; DataUnavailableError when unreadable or lacking ``columns``."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds; all mean "unreadable"
        raise DataUnavailableError(f"{path} cannot be read as parquet: {type(exc).__name__}: {exc}") from None
    check_names(names, str(path))
    missing = [c for c in columns or [] if c not in names]
    if missing:
        raise DataUnavailableError(f"{path} lacks column(s) {missing}; found {names}")
    return pf


def _parquet_batches(path: Path, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
    pf = _parquet(path, columns)
    offset = 0
    for i in range(pf.num_row_groups):  # one row group at a time, not the whole file
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[i], columns=columns, use_threads=False):
                check_batch_cells(batch, str(path), offset)
                offset += batch.num_rows
                yield batch
        except OSError as exc:
            raise DataUnavailableError(f"{path} row group {i} cannot be read: {exc}") from None


def _csv_batches(path: Path, columns: list[str] | None, batch_rows: int,
                 types: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    schema = _csv_schema(path, types)
    missing = [c for c in columns or [] if c not in schema.names]
    if missing:
        raise DataUnavailableError(f"{path} lacks column(s) {missing}; found {schema.names}")
    convert = pcsv.ConvertOptions(column_types={f.name: f.type for f in schema},
                                  include_columns=list(columns) if columns else None)
    with _open_csv(path, convert) as reader:
        while True:
            try:
                block = reader.read_next_batch()
            except StopIteration:
                return
            except (pa.ArrowInvalid, OSError) as exc:
                raise DataUnavailableError(_csv_error(path, schema.names, exc)) from None
            for start in range(0, block.num_rows, batch_rows):
                yield block.slice(start, batch_rows)


def _open_csv(path: Path, convert=None):
    """pyarrow's streaming CSV reader over ``path``; DataUnavailableError when it cannot start."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    try:
        return pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES, use_threads=False),
                             convert_options=convert)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataUnavailableError(f"{path} cannot be read as csv: {type(exc).__name__}: {exc}") from None


def _csv_schema(path: Path, types: dict[str, Any]) -> pa.Schema:
    """The first block's inferred schema, widened (see iter_batches), ``types`` forced."""
    import pyarrow as pa

    if not path.is_file():
        raise DataUnavailableError.not_pulled(path)
    check_table(path)  # the bounds tasks.table.read_table holds too: what init reads, a run reads
    with _open_csv(path) as probe:
        inferred = probe.schema
    return pa.schema([f.with_type(types[f.name]) if f.name in types
                      else f.with_type(pa.float64()) if pa.types.is_integer(f.type) or pa.types.is_null(f.type)
                      else f for f in inferred])


def source_schema(source: Path, types: dict[str, Any] | None = None) -> pa.Schema:
    """The Arrow schema :func:`iter_batches` yields for ``source``, without reading the data."""
    source = Path(source)
    if source_format(source) == "csv":
        return _csv_schema(source, types or {})
    return _parquet(parquet_files(source)[0]).schema_arrow


def _csv_error(path: Path, names: list[str], exc: Exception) -> str:
    """A conversion error with the column's name (pyarrow gives only its position)."""
    text = str(exc)
    if "straddl" in text:  # Arrow's word for a row longer than its block
        return (f"{path} cannot be read as csv: a row is longer than {CSV_BLOCK_BYTES:,} bytes (each of its cells "
                "is within bounds, but together they are not); split its text over rows or convert the file to "
                "Parquet")
    m = re.search(r"CSV column #(\d+)", text)
    where = f" (column {names[int(m.group(1))]!r})" if m and int(m.group(1)) < len(names) else ""
    return (f"{path} cannot be read as csv{where}: {type(exc).__name__}: {text}; a value there does not fit "
            "the type its first block showed: give the column's type (types=) or convert the file to Parquet")


# --------------------------------------------------------------------------- statistics


@dataclass
class ColumnStats:
    """Running statistics of one column: batches folded in with :meth:`update`, parts with :meth:`merge`
    (Chan et al.'s update). ``mean``/``m2``/``min``/``max`` for numeric columns only; ``values``:
    value -> count, for a column made with ``values={}``."""

    name: str
    count: int = 0
    nulls: int = 0
    numeric: bool | None = None
    min: Any = None
    max: Any = None
    mean: float = 0.0
    m2: float = 0.0
    values: dict | None = None
    integral: bool = True  # every non-null value a whole number (so far)

    def var(self, ddof: int = 0) -> float:
        """Variance of the non-null values (NaN when count <= ddof)."""
        return self.m2 / (self.count - ddof) if self.count > ddof else math.nan

    @property
    def std(self) -> float:
        """Population standard deviation (ddof 0; NaN when there are no values)."""
        return math.sqrt(self.var(0)) if self.count else math.nan

    def update(self, array: pa.Array | pa.ChunkedArray) -> None:
        """Fold in one batch's column (any Arrow array)."""
        import pyarrow as pa

        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        # An all-null batch says nothing of the column's kind; a kind that changes between files makes
        # the column non-numeric (``merge``).
        null = pa.types.is_null(array.type)
        numeric = self.numeric if null else pa.types.is_integer(array.type) or pa.types.is_floating(array.type)
        part = ColumnStats(self.name, values={} if self.values is not None else None)
        if numeric and not null:
            part._numeric_part(array)
        else:
            part.nulls = array.null_count
            part.count = len(array) - part.nulls
            part.numeric = numeric
            if part.count:
                part.integral = False
        if part.values is not None:
            part._count_values(array)
        self.merge(part)

    def _numeric_part(self, array: pa.Array) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        self.numeric = True
        # Nulls become NaN; an integer beyond 2**53 (a 64-bit id) rounds here, and its exact
        # min/max come from the integers below.
        x = pc.cast(array, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        valid = ~np.isnan(x)
        v = x[valid] if not valid.all() else x
        self.count = int(v.size)
        self.nulls = len(x) - self.count
        if not self.count:
            return
        if pa.types.is_integer(array.type):
            # Exact for integers beyond 2**53 (float64 would round them).
            mm = pc.min_max(array)
            self.min, self.max = mm["min"].as_py(), mm["max"].as_py()
        else:
            self.min, self.max = float(v.min()), float(v.max())
            finite = np.isfinite(v)
            self.integral = bool(finite.all() and (v == np.round(v)).all() and (np.abs(v) < 2**53).all())
        self.mean = float(v.mean())
        d = v - self.mean
        self.m2 = float(np.dot(d, d))

    def _count_values(self, array: pa.Array) -> None:
        import pyarrow.compute as pc

        counts = pc.value_counts(array.drop_null())
        for value, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
            if isinstance(value, float) and math.isnan(value):
                continue  # NaN is a null (counted in nulls)
            self.values[value] = self.values.get(value, 0) + n

    def merge(self, other: ColumnStats) -> None:
        """Add ``other`` (another part of the same column) into this one (Chan et al.'s update)."""
        if other.numeric is not None:
            self.numeric = other.numeric if self.numeric is None else (self.numeric and other.numeric)
        n = self.count + other.count
        if other.count:
            delta = other.mean - self.mean
            self.mean += delta * other.count / n
            self.m2 += other.m2 + delta * delta * self.count * other.count / n
            self.min = other.min if self.min is None else (self.min if other.min is None else min(self.min, other.min))
            self.max = other.max if self.max is None else (self.max if other.max is None else max(self.max, other.max))
            self.integral = self.integral and other.integral
        self.count, self.nulls = n, self.nulls + other.nulls
        if other.values is not None:
            if self.values is None:
                self.values = {}
            for value, k in other.values.items():
                self.values[value] = self.values.get(value, 0) + k
        if not self.numeric:
            self.min = self.max = None
            self.mean, self.m2 = 0.0, 0.0
