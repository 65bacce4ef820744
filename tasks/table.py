"""Tables as people have them: CSV or Parquet with named columns, torch-free, read the same way
for validation and training. One file is split into train and test here, by a seeded permutation
(stratified by class for a classification label)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.config import DatasetConfig
from core.errors import DataUnavailableError
from tasks.bounds import check_table

if TYPE_CHECKING:
    import pandas as pd

SPLITS = ("train", "test")
FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def split_paths(cfg: DatasetConfig, root: Path) -> dict[str, Path]:
    """The files the dataset is read from: ``{"train", "test"}`` or ``{"all"}`` (one file split by seed)."""
    return {k: Path(root) / cfg.path / name for k, name in cfg.split_files.items()}


def read_table(path: Path) -> "pd.DataFrame":
    """One CSV or Parquet file as a DataFrame. Raises DataUnavailableError naming the file
    (``tasks.bounds.DataRefusedError`` naming the column and row of a cell or a name out of bounds)."""
    import pandas as pd

    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataUnavailableError(f"{path}: unknown table format {path.suffix!r}; use .csv or .parquet")
    if not path.is_file():
        raise DataUnavailableError.not_pulled(path)
    check_table(path)  # the bounds tasks.columnar holds too: what init reads, a run reads
    try:
        return pd.read_parquet(path) if fmt == "parquet" else pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - pandas raises many kinds; all mean "unreadable"
        raise DataUnavailableError(f"{path} cannot be read as {fmt}: {type(exc).__name__}: {exc}") from None


def feature_columns(cfg: DatasetConfig, columns: list[str]) -> list[str]:
    """The feature columns: ``dataset.features``, or every column of ``columns`` but the label and
    ``dataset.exclude``, in file order."""
    if cfg.features is not None:
        return list(cfg.features)
    skip = {cfg.label, *cfg.exclude}
    return [str(c) for c in columns if str(c) not in skip]


def row_hashes(frame: "pd.DataFrame") -> np.ndarray:
    """uint64 per row over all its columns, equal for rows with equal values (numbers by their text
    form, ``tasks.encoding.category_keys``), whatever dtypes a table or its batches got."""
    import pandas as pd

    from tasks.encoding import category_keys

    h = np.zeros(len(frame), dtype=np.uint64)
    for i in range(frame.shape[1]):
        keys = category_keys(frame.iloc[:, i])
        keys[pd.isna(keys)] = "\x00"  # a missing value, unlike any text
        part = pd.util.hash_array(keys.astype(object), categorize=False)
        with np.errstate(over="ignore"):
            h = (h * np.uint64(0x100000001B3)) ^ part
    return h


def seeded_split(labels: "pd.Series | None", n: int, fraction: float, seed: int,
                 stratify: bool, groups: np.ndarray | None = None) -> tuple[list[int], list[int]]:
    """Row positions (keep, held) of ``n`` rows: a seeded permutation sends ceil(n*f) rows to held,
    within each class when ``stratify`` (nulls form their own class). ``groups`` (a group id per
    row, e.g. :func:`row_hashes`) go to one side whole, taken in the permuted order of their first
    rows until the held rows reach ceil(n*f): a duplicate never ends up in both splits."""
    import math

    rng = np.random.default_rng(seed)
    if groups is None:
        groups = np.arange(n)
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    # Groups numbered by their first row: a group's rows then take one position of the permutation.
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    group_of = rank[inverse]
    sizes = np.bincount(group_of, minlength=len(order))

    def take(rows: np.ndarray, k: int, limit: int | None = None) -> np.ndarray:
        """Held groups of ``rows``' groups (in first-row order), permuted, until k rows are held."""
        gs = np.unique(group_of[rows])  # ascending: first-row order
        gs = gs[rng.permutation(len(gs))]
        filled = np.cumsum(sizes[gs])
        count = min(int(np.searchsorted(filled, k)) + 1 if k > 0 else 0, len(gs))
        if limit is not None:
            while count and filled[count - 1] > limit:
                count -= 1
        return gs[:count]

    if not stratify or labels is None:
        k = min(math.ceil(n * fraction), max(n - 1, 0))
        held_groups = take(np.arange(n), k, limit=max(n - 1, 0))
    else:
        keys = labels.astype("string").fillna("<null>").to_numpy()
        classes = [np.flatnonzero(keys == value) for value in sorted(set(keys))]
        held_groups = np.concatenate([take(idx, math.ceil(len(idx) * fraction)) for idx in classes]
                                     or [np.zeros(0, dtype=np.int64)])
    is_held = np.zeros(len(order), dtype=bool)
    is_held[held_groups] = True
    return np.flatnonzero(~is_held[group_of]).tolist(), np.flatnonzero(is_held[group_of]).tolist()


def labeled(df: "pd.DataFrame", label: str) -> "pd.DataFrame":
    """``df`` without its rows whose ``label`` is missing (``df`` itself when there are none)."""
    if label not in df.columns:
        return df
    missing = df[label].isna()
    return df[~missing].reset_index(drop=True) if missing.any() else df


def load_frames(cfg: DatasetConfig, root: Path, seed: int, stratify: bool,
                labeled_only: bool = False) -> dict[str, "pd.DataFrame"]:
    """``{"train": df, "test": df}`` as the files hold them; one ``dataset.file`` split with
    ``test_fraction`` and ``seed`` (:func:`seeded_split`, duplicates on one side). ``labeled_only``:
    unlabeled rows left out after the split (what training and evaluation take)."""
    paths = split_paths(cfg, root)
    if "all" not in paths:
        frames = {s: read_table(paths[s]) for s in SPLITS}
    else:
        df = read_table(paths["all"])
        labels = df[cfg.label] if stratify and cfg.label in df.columns else None
        keep, held = seeded_split(labels, len(df), cfg.test_fraction, seed, stratify, groups=row_hashes(df))
        frames = {"train": df.iloc[keep].reset_index(drop=True), "test": df.iloc[held].reset_index(drop=True)}
    return {s: labeled(f, cfg.label) for s, f in frames.items()} if labeled_only else frames
