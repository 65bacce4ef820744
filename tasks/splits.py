"""What a task's loader returns (``Splits``) and the seeded per-class hold-out that makes ``val``.
``train`` is a ``TensorDataset`` or a streamed ``training.batches.BatchSource``; ``val`` and ``test``
are tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tasks.info import DataInfo

if TYPE_CHECKING:
    from torch.utils.data import TensorDataset


def tensors(a: np.ndarray, b: np.ndarray) -> "TensorDataset":
    """A ``TensorDataset`` over two arrays (made contiguous, shared with numpy where possible)."""
    import torch
    from torch.utils.data import TensorDataset

    return TensorDataset(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b)))


@dataclass
class Splits:
    train: TensorDataset
    val: TensorDataset
    test: TensorDataset
    # What the model is built from (the task's ``DataInfo``: features, classes, scaling).
    info: DataInfo = field(default_factory=DataInfo)


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
    none = [np.zeros(0, dtype=np.int64)]  # no labels: nothing to keep or hold
    return np.sort(np.concatenate(keep or none)), np.sort(np.concatenate(hold or none))
