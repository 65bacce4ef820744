"""Tables as people have them: CSV or Parquet with named columns, torch-free.

Read by validation (the whole files, as pandas frames) and by the tabular tasks' training
data (the same frames, then tensors). One file split into train and test is split here, the
same way for both: a seeded permutation, stratified by class for a classification label.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.config import DatasetConfig
from core.errors import DataUnavailableError

if TYPE_CHECKING:
    import pandas as pd

SPLITS = ("train", "test")
FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def split_paths(cfg: DatasetConfig, root: Path) -> dict[str, Path]:
    """The files the dataset is read from: ``{"train", "test"}`` or ``{"all"}`` (one file split by seed)."""
    return {k: Path(root) / cfg.path / name for k, name in cfg.split_files.items()}


def read_table(path: Path) -> "pd.DataFrame":
    """One CSV or Parquet file as a DataFrame. Raises DataUnavailableError naming the file."""
    import pandas as pd

    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataUnavailableError(f"{path}: unknown table format {path.suffix!r}; use .csv or .parquet")
    if not path.is_file():
        raise DataUnavailableError(f"{path} does not exist. The DVC-tracked data is missing from the workspace; "
                                   f"run `dvc pull` (or check dataset.path)")
    try:
        if fmt == "parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - pandas raises many kinds; all mean "unreadable"
        raise DataUnavailableError(f"{path} cannot be read as {fmt}: {type(exc).__name__}: {exc}") from None


def feature_columns(cfg: DatasetConfig, columns: list[str]) -> list[str]:
    """The feature columns: ``dataset.features``, or every column of ``columns`` but the label and
    ``dataset.exclude``, in file order."""
    if cfg.features is not None:
        return list(cfg.features)
    skip = {cfg.label, *cfg.exclude}
    return [str(c) for c in columns if str(c) not in skip]


def seeded_split(labels: "pd.Series | None", n: int, fraction: float, seed: int,
                 stratify: bool) -> tuple[list[int], list[int]]:
    """Row positions (keep, held) of ``n`` rows: a seeded permutation sends ceil(n*f) to held,
    within each class when ``stratify`` (labels as given; nulls form their own group)."""
    import math

    import numpy as np

    rng = np.random.default_rng(seed)
    if not stratify or labels is None:
        perm = rng.permutation(n)
        k = min(math.ceil(n * fraction), max(n - 1, 0))
        return sorted(perm[k:].tolist()), sorted(perm[:k].tolist())
    keys = labels.astype("string").fillna("<null>").to_numpy()
    keep, held = [], []
    for value in sorted(set(keys)):
        idx = np.flatnonzero(keys == value)
        idx = idx[rng.permutation(len(idx))]
        k = int(math.ceil(len(idx) * fraction))
        held.extend(idx[:k].tolist())
        keep.extend(idx[k:].tolist())
    return sorted(keep), sorted(held)


def load_frames(cfg: DatasetConfig, root: Path, seed: int, stratify: bool) -> dict[str, "pd.DataFrame"]:
    """``{"train": df, "test": df}`` as the files hold them (no column is dropped or cast).

    One ``dataset.file`` is split here with ``test_fraction`` and ``seed`` (stratified by the
    label when ``stratify`` and the label column exists): validation and training get the same rows.
    """
    paths = split_paths(cfg, root)
    if "all" not in paths:
        return {s: read_table(paths[s]) for s in SPLITS}
    df = read_table(paths["all"])
    labels = df[cfg.label] if stratify and cfg.label in df.columns else None
    keep, held = seeded_split(labels, len(df), cfg.test_fraction, seed, stratify)
    return {"train": df.iloc[keep].reset_index(drop=True), "test": df.iloc[held].reset_index(drop=True)}
