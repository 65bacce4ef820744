"""A table task's train split streamed by Parquet row groups (``Task.table_stream``): which loader the
data calls for, the Parquet source (a large CSV converted once into the cache), the task's ``info``
from one pass (cached), and the reader of one row group. The engine's half (row groups' order,
held-out rows, the batch source) is ``training.stream``.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from core.errors import DataUnavailableError

if TYPE_CHECKING:
    from core.config import PipelineConfig

log = logging.getLogger("trainflow.stream")

# Rows per row group of a converted CSV: it fixes the global order, so it is in the cache folder's name.
CONVERTED_ROW_GROUP_ROWS = 131072
Reader = Callable[[int], tuple[np.ndarray, np.ndarray]]


@dataclass
class TableStream:
    """``task``'s train split as the Parquet file or folder ``source``: the engine scans its row groups
    (``training.stream.scan_row_groups``) and ``open(groups)`` answers ``(info, read, y_dtype)``."""

    task: Any
    cfg: "PipelineConfig"
    root: Path
    data_md5: str
    source: Path

    @classmethod
    def of(cls, task, cfg: "PipelineConfig", root: Path, data_md5: str) -> "TableStream":
        from tasks.table import split_paths

        if cfg.dataset.file is not None:
            raise DataUnavailableError("training.loader: streaming needs pre-split data (dataset.train_file and "
                                       "dataset.test_file), got dataset.file split by seed")
        source = parquet_source(split_paths(cfg.dataset, root)["train"], root, data_md5,
                                cfg.training.loader.csv_parquet_above_mb)
        return cls(task, cfg, root, data_md5, source)

    def open(self, groups) -> tuple[Any, Reader, Any]:
        task = self.task
        info = info_once(task, self.cfg, self.root, self.source, groups, self.data_md5)

        def targets(labels) -> np.ndarray:  # the task's encoding, as the in-memory path applies it
            return task.train_targets(task.targets(labels.to_pandas(), info), info)

        read = table_reader(groups, info.features, self.cfg.dataset.label, targets,
                            lambda frame: task.features_of(frame, info))
        return info, read, task.target_dtype()


def table_reader(groups, features: list[str], label: str,
                 targets: Callable[["object"], np.ndarray],
                 encode: Callable[["object"], np.ndarray] | None = None) -> Reader:
    """``read(u)`` for a table: ``encode(row group u's feature columns, a pandas frame)`` (float32
    ``[rows, f]``; None: numeric columns as they are) and ``targets(the label column, pyarrow)``."""
    import pyarrow.parquet as pq

    files: dict[int, object] = {}
    lock = threading.Lock()  # a ParquetFile is read by one thread at a time

    def read(unit: int) -> tuple[np.ndarray, np.ndarray]:
        f, g = int(groups.file_of[unit]), int(groups.group_of[unit])
        path = groups.files[f]
        with lock:
            try:
                pf = files.get(f) or files.setdefault(f, pq.ParquetFile(path))
                table = pf.read_row_group(g, columns=[*features, label], use_threads=False)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds; all mean "unreadable"
                raise DataUnavailableError(f"{path} row group {g} cannot be read: {type(exc).__name__}: "
                                           f"{exc}") from None
        try:
            frame = table.select(features).to_pandas()
            x = encode(frame) if encode is not None else frame.to_numpy(dtype=np.float32, na_value=np.nan)
        except (DataUnavailableError, TypeError, ValueError) as exc:
            raise DataUnavailableError(f"{path} row group {g}: {exc}") from None
        return x, targets(table.column(label))

    return read


def choose_loader(cfg: "PipelineConfig", root: Path) -> tuple[str, str]:
    """(the loader ``training.loader.kind`` means for this data: ``memory``, ``dataloader`` or
    ``stream``, why); ``auto`` streams a train split larger than ``stream_above_mb``."""
    from tasks.table import split_paths

    lc = cfg.training.loader
    if lc.kind != "auto":
        return lc.kind, f"training.loader.kind: {lc.kind}"
    if cfg.dataset.file is not None:
        return "memory", "auto: dataset.file is split by seed in memory (streaming needs train_file and test_file)"
    path = split_paths(cfg.dataset, root)["train"]
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path] if path.is_file() else []
    size = sum(p.stat().st_size for p in files)
    mib = size / 2**20
    if size <= lc.stream_above_mb * 2**20:
        return "memory", f"auto: train split is {mib:.1f} MiB <= stream_above_mb {lc.stream_above_mb:g}"
    if path.suffix.lower() == ".csv" and mib <= lc.csv_parquet_above_mb:
        return "memory", f"auto: a CSV train split of {mib:.1f} MiB <= csv_parquet_above_mb {lc.csv_parquet_above_mb:g}"
    return "stream", f"auto: train split is {mib:.1f} MiB > stream_above_mb {lc.stream_above_mb:g}"


def parquet_source(path: Path, root: Path, data_md5: str, csv_above_mb: float) -> Path:
    """The Parquet file or folder to stream ``path`` from: itself, or for a CSV larger than
    ``csv_above_mb`` its cached Parquet copy; a smaller CSV: DataUnavailableError."""
    from tasks.columnar import source_format

    path = Path(path)
    if source_format(path) == "parquet":
        return path
    size = path.stat().st_size if path.is_file() else 0
    if size <= csv_above_mb * 2**20:
        raise DataUnavailableError(f"{path}: a CSV of {size / 2**20:.1f} MiB is below "
                                   f"training.loader.csv_parquet_above_mb ({csv_above_mb:g}): load it in memory "
                                   "(training.loader.kind: memory or auto) or convert it to Parquet")
    return csv_to_parquet(path, root, data_md5)


def csv_to_parquet(path: Path, root: Path, data_md5: str, row_group_rows: int = CONVERTED_ROW_GROUP_ROWS) -> Path:
    """``path`` (a CSV) as Parquet in ``TRAINFLOW_HOME/cache/parquet/``, keyed by the data's DVC md5:
    converted once in bounded memory, ``row_group_rows`` rows per row group, under a lock."""
    import re

    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.locks import exclusive
    from core.paths import trainflow_home, under_home
    from tasks.columnar import iter_batches

    if not re.fullmatch(r"[0-9a-fA-F]{32}(\.dir)?", data_md5 or ""):
        raise DataUnavailableError(f"cannot cache {path} as Parquet: data md5 {data_md5!r} is not a DVC md5")
    home = trainflow_home(Path(root))
    folder = under_home(home, "cache", "parquet", f"{data_md5}-rg{row_group_rows}")
    out = folder / (path.stem + ".parquet")
    if out.is_file():
        return out
    with exclusive(folder.parent / f"{data_md5}.lock", timeout_s=3600):
        if out.is_file():  # another rank or run converted it while this one waited
            return out
        folder.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        writer, pending, held = None, [], 0

        def write(table) -> None:
            nonlocal writer
            writer = writer or pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table, row_group_size=row_group_rows)

        try:
            for batch in iter_batches(path, batch_rows=row_group_rows):
                pending.append(batch)
                held += batch.num_rows
                while held >= row_group_rows:  # exactly row_group_rows per row group: a fixed layout
                    table = pa.Table.from_batches(pending)
                    write(table.slice(0, row_group_rows))
                    rest = table.slice(row_group_rows)
                    pending, held = rest.to_batches(), rest.num_rows
            if pending and (held or writer is None):
                write(pa.Table.from_batches(pending))
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise DataUnavailableError(f"{path}: an empty CSV")
        os.replace(tmp, out)
    log.info("converted %s to %s (%d row groups)", path, out, pq.ParquetFile(out).num_row_groups)
    return out


def info_once(task, cfg: "PipelineConfig", root: Path, source: Path, groups, data_md5: str):
    """The task's ``stream_info`` (a pass over the whole train split) once per data, config and code:
    cached as JSON in ``TRAINFLOW_HOME/cache/stream/`` under a lock (a read-only home: computed here)."""
    import json

    from core.hashing import file_id, file_sha256, sha256_json
    from core.locks import exclusive
    from core.paths import trainflow_home, under_home
    from tasks.base import cache_write

    here = Path(__file__).parent
    code = [Path(__file__), *(here / f for f in ("tabular.py", "columnar.py", "encoding.py"))]
    exp = cfg.dataset.expectations_file
    key = sha256_json({"task": task.name, "dataset": cfg.dataset.model_dump(mode="json"), "md5": data_md5,
                       "files": [file_id(f) for f in groups.files],
                       "expectations": file_id(Path(root) / exp) if exp else None,
                       "code": [file_sha256(p) for p in code]})[:32]

    def compute():
        return task.stream_info(cfg, root, source, groups.names, groups.types)

    try:
        folder = under_home(trainflow_home(Path(root)), "cache", "stream")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{key}.json"
        with exclusive(folder / f"{key}.lock", timeout_s=3600):
            try:
                return task.info_type.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):  # TypeError: written with other fields
                info = compute()
                data = json.dumps(info.to_json()).encode()
                cache_write(path, lambda fh: fh.write(data))
                return info
    except OSError:
        return compute()
