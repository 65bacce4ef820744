"""Bounds that keep one bad file from hurting the host, torch- and pandas-free.

A table cell, a column name, a class name and the number of classes are bounded where a table is
read: :func:`check_table` runs in ``tasks.table.read_table`` (init's profile, validation and
training of tables read whole) and in ``tasks.columnar`` (tables read batch by batch), so what
``trainflow init`` accepts, a run reads, and both refuse the same input with the same line.
:func:`check_classes` runs in init and again in validation (a hand-written config meets it there).
"""

from __future__ import annotations

from pathlib import Path

from core.errors import DataUnavailableError
from core.printable import printable

# A cell holds a number, a category or a short text: 64 KiB is some thirty pages of text.
MAX_CELL_BYTES = 64 << 10
# A column name or a class name is a name: it is printed in reports and written into YAML.
MAX_NAME_CHARS = 256
# A classification label: at most this many classes, and on average at least MIN_ROWS_PER_CLASS
# labeled rows of each (fewer is an id or a continuous value, not classes: a split leaves most
# classes unseen in train, and a model or the trees' baseline sizes its output by the classes).
MAX_CLASSES = 10_000
MIN_ROWS_PER_CLASS = 5
SCAN_CHUNK_BYTES = 4 << 20  # bytes of a CSV file measured at once (the count holds ~20 bytes per byte)


class DataRefusedError(DataUnavailableError):
    """The data is readable but breaks a bound that protects the host; the message names the file,
    the column, the row and the size."""


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def check_names(names: list, where: str) -> None:
    """DataRefusedError for a column name longer than MAX_NAME_CHARS or one given twice."""
    seen: dict[str, int] = {}
    for i, name in enumerate(str(n) for n in names):
        if len(name) > MAX_NAME_CHARS:
            raise DataRefusedError(f"{printable(where)}: column {i + 1}'s name is {len(name):,} characters long "
                                   f"({_short(name)}); a column name may have at most {MAX_NAME_CHARS}")
        if name in seen:
            raise DataRefusedError(f"{printable(where)}: column {name!r} is named twice in the header (columns "
                                   f"{seen[name] + 1} and {i + 1}); give each column its own name")
        seen[name] = i


def check_classes(n_classes: int, rows: int, label: str, where: str) -> None:
    """DataRefusedError when a classification label has more classes than its rows can teach."""
    if n_classes > MAX_CLASSES or rows < MIN_ROWS_PER_CLASS * n_classes:
        raise DataRefusedError(
            f"{printable(where)}: label {label!r} has {n_classes:,} distinct values in {rows:,} labeled rows; a "
            f"classification label needs at least {MIN_ROWS_PER_CLASS} rows per class on average and at most "
            f"{MAX_CLASSES:,} classes. An id or a measurement is no class: exclude it, or predict a number "
            "(--task regression)")


def check_class_names(values, label: str, where: str) -> None:
    """DataRefusedError naming the first class name longer than MAX_NAME_CHARS."""
    for v in values:
        text = str(v)
        if len(text) > MAX_NAME_CHARS:
            raise DataRefusedError(f"{printable(where)}: label {label!r} has a class name of {len(text):,} "
                                   f"characters ({_short(text)}); a class name may have at most {MAX_NAME_CHARS}")


def check_table(path: Path) -> None:
    """The bounds of one table file before anything parses it: a CSV's cells (measured on its bytes,
    quotes honoured) and header, a Parquet file's column names and text cells. DataRefusedError names
    the first that breaks one; a file that cannot be read is left to the reader's own error."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        if path.is_file():
            _check_csv_cells(path)
            check_names(_csv_header(path), str(path))
        return
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception:  # noqa: BLE001 - unreadable: the reader names the file and the reason
        return
    check_names(pf.schema_arrow.names, str(path))
    text = [f.name for f in pf.schema_arrow if _is_text(f.type)]
    if text:
        offset = 0
        for batch in pf.iter_batches(columns=text, use_threads=False):
            check_batch_cells(batch, str(path), offset)
            offset += batch.num_rows


def _is_text(arrow_type) -> bool:
    import pyarrow as pa

    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type))


def check_batch_cells(batch, where: str, offset: int = 0) -> None:
    """DataRefusedError naming the column and row (``offset`` + position) of a text cell longer than
    MAX_CELL_BYTES in an Arrow batch."""
    import numpy as np
    import pyarrow.compute as pc

    for name, column in zip(batch.schema.names, batch.columns):
        if not _is_text(column.type) or len(column) == 0:
            continue
        lengths = pc.binary_length(column).to_numpy(zero_copy_only=False)
        lengths = np.nan_to_num(lengths.astype(np.float64), nan=0.0)
        if lengths.max() > MAX_CELL_BYTES:
            row = int(np.argmax(lengths > MAX_CELL_BYTES))
            _refuse_cell(where, name, offset + row, int(lengths[row]))


def _refuse_cell(where: str, column: str, row: int, n: int) -> None:
    raise DataRefusedError(f"{printable(where)}: column {column!r}, row {row}: a cell of {n:,} bytes; a table cell "
                           f"may hold at most {MAX_CELL_BYTES:,} bytes (a number, a category or a short text)")


def _csv_header(path: Path) -> list[str]:
    import csv

    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        return next(csv.reader(fh), [])


def _check_csv_cells(path: Path) -> None:
    """Every cell of a CSV file measured on its bytes, a chunk at a time: separators (``,`` and a
    newline) outside double quotes end a cell. DataRefusedError at the first cell over MAX_CELL_BYTES."""
    size = path.stat().st_size
    if size <= MAX_CELL_BYTES:
        return

    def refuse(rec: int, c: int, n: int) -> None:
        # A quote inside an unquoted cell (12" as inches) is a literal to the parsers, but it turns the
        # byte count's quote parity: where the file has quotes, the csv module has the last word.
        if has_quotes and not _csv_has_long_field(path):
            raise _Fits
        if rec == 0:
            raise DataRefusedError(f"{printable(path)}: the header's column {c + 1} is {n:,} bytes long; a column "
                                   f"name may have at most {MAX_NAME_CHARS} characters")
        header = _csv_header(path)
        _refuse_cell(str(path), header[c] if c < len(header) else f"#{c + 1}", rec - 1, n)

    with open(path, "rb") as fh:
        has_quotes = any(b'"' in block for block in iter(lambda: fh.read(SCAN_CHUNK_BYTES), b""))
    try:
        _scan(path, size, has_quotes, refuse)
    except _Fits:
        return


class _Fits(Exception):
    """The byte count's suspicion was wrong: every cell fits."""


def _csv_has_long_field(path: Path) -> bool:
    """Whether Python's csv module finds a field over MAX_CELL_BYTES characters in ``path``."""
    import csv

    old = csv.field_size_limit()
    csv.field_size_limit(MAX_CELL_BYTES)
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            for _ in csv.reader(fh):
                pass
    except csv.Error as exc:
        return "field larger than field limit" in str(exc)
    finally:
        csv.field_size_limit(old)
    return False


def _scan(path: Path, size: int, has_quotes: bool, refuse) -> None:
    """The byte count of :func:`_check_csv_cells`; ``refuse(record, column, bytes)`` at the first long cell."""
    import numpy as np

    quotes, last, record, col, offset = 0, -1, 0, 0, 0  # quotes seen, last separator, records ended, cells
    with open(path, "rb") as fh:
        while chunk := fh.read(SCAN_CHUNK_BYTES):
            a = np.frombuffer(chunk, dtype=np.uint8)
            q = a == 34
            outside = ((np.cumsum(q, dtype=np.int64) + quotes) & 1) == 0
            newline = (a == 10) & outside
            sep = np.flatnonzero(((a == 44) & outside) | newline)
            ends = sep.astype(np.int64) + offset
            lengths = ends - np.concatenate(([last], ends[:-1])) - 1
            ends_record = newline[sep]
            long = np.flatnonzero(lengths > MAX_CELL_BYTES)
            if long.size:
                k = int(long[0])
                before = np.flatnonzero(ends_record[:k])
                refuse(record + before.size, k - int(before[-1]) - 1 if before.size else col + k, int(lengths[k]))
            quotes += int(q.sum())
            if sep.size:
                last = int(ends[-1])
                nl = np.flatnonzero(ends_record)
                record += nl.size
                col = sep.size - int(nl[-1]) - 1 if nl.size else col + sep.size
            offset += len(chunk)
    if size - last - 1 > MAX_CELL_BYTES:
        refuse(record, col, size - last - 1)
