"""Loading the CSV splits into tensors, and the deterministic train/val split."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from core.config import DatasetConfig
from core.errors import DataUnavailableError


@dataclass
class Splits:
    train: TensorDataset
    val: TensorDataset
    test: TensorDataset


def read_csv(path: Path, columns: list[str], label: str) -> tuple[np.ndarray, np.ndarray]:
    """(features float32 [n, f], labels int64 [n]); the header must equal ``columns``."""
    try:
        with open(path) as fh:
            header = fh.readline().strip().split(",")
    except OSError as exc:
        raise DataUnavailableError(f"cannot read {path}: {exc.strerror}; run `dvc pull`") from None
    if header != columns:
        raise DataUnavailableError(f"{path}: columns differ from the config's dataset columns")
    arr = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32, ndmin=2)
    li = columns.index(label)
    feats = np.delete(arr, li, axis=1)
    return feats, arr[:, li].astype(np.int64)


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (keep, holdout): within each class a seeded permutation sends ceil(n*f) to holdout."""
    rng = np.random.default_rng(seed)
    keep, hold = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        idx = idx[rng.permutation(len(idx))]
        n = int(np.ceil(len(idx) * fraction))
        hold.append(idx[:n])
        keep.append(idx[n:])
    return np.sort(np.concatenate(keep)), np.sort(np.concatenate(hold))


def load_splits(cfg: DatasetConfig, root: Path, seed: int) -> Splits:
    base = root / cfg.path
    x, y = read_csv(base / cfg.train_file, cfg.columns, cfg.label_column)
    xt, yt = read_csv(base / cfg.test_file, cfg.columns, cfg.label_column)
    keep, hold = stratified_holdout(y, cfg.val_fraction, seed)

    def ds(a, b):
        return TensorDataset(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b)))

    return Splits(train=ds(x[keep], y[keep]), val=ds(x[hold], y[hold]), test=ds(xt, yt))
