"""Loading the dataset splits into tensors, and the deterministic train/val split.

Tabular (``dataset.kind: tabular``): CSV features float32 ``[n, f]`` and int64 labels ``[n]``.
Text (``dataset.kind: text``): byte tokens. Each document's UTF-8 bytes are cut into windows;
``x`` is int64 ``[n, seq_len]`` (bytes 0..255) and ``y`` the same window shifted by one byte
(next-token targets). ``train`` holds windows of the train file's documents minus a seeded
``holdout_fraction`` of them, which form ``val`` (per-epoch validation); ``test`` holds the
eval file's documents (the evaluation gate's split).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from core.config import DatasetConfig
from core.errors import DataUnavailableError

if TYPE_CHECKING:  # torch is imported where tensors are made: readers like read_csv stay torch-free
    from torch.utils.data import TensorDataset


def _tensors(a: np.ndarray, b: np.ndarray) -> "TensorDataset":
    import torch
    from torch.utils.data import TensorDataset

    return TensorDataset(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b)))


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
    """The train / val / test TensorDatasets of either kind. Raises DataUnavailableError."""
    if cfg.kind == "text":
        return load_text_splits(cfg, root, seed)
    base = root / cfg.path
    x, y = read_csv(base / cfg.train_file, cfg.columns, cfg.label_column)
    xt, yt = read_csv(base / cfg.test_file, cfg.columns, cfg.label_column)
    keep, hold = stratified_holdout(y, cfg.val_fraction, seed)

    def ds(a, b):
        return _tensors(a, b)

    return Splits(train=ds(x[keep], y[keep]), val=ds(x[hold], y[hold]), test=ds(xt, yt))


# -- text ---------------------------------------------------------------------------------
def read_documents(path: Path) -> list[tuple[str, bytes]]:
    """``[(doc path, UTF-8 bytes)]`` from a JSON Lines corpus file, in file order.

    Raises DataUnavailableError when the file is missing or a line is not a
    ``{"path", "text"}`` object (the validation suite reports content problems in detail).
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DataUnavailableError(f"cannot read {path}: {exc.strerror}; run `dvc pull`") from None
    docs = []
    for i, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            docs.append((str(obj["path"]), obj["text"].encode("utf-8")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataUnavailableError(f"{path}:{i}: not a JSON object with string 'path' and 'text' "
                                       f"({type(exc).__name__}: {exc})") from None
    return docs


def window_starts(n_tokens: int, seq_len: int, stride: int) -> list[int]:
    """Starts of full windows over a document of ``n_tokens`` bytes (a window needs seq_len + 1).

    Every ``stride`` bytes, plus one final window ending at the document's last byte when the
    strided ones stop short of it, so no tail is lost. Shorter documents give none.
    """
    last = n_tokens - seq_len - 1
    if last < 0:
        return []
    starts = list(range(0, last + 1, stride))
    if starts[-1] != last:
        starts.append(last)
    return starts


def cut_windows(docs: list[bytes], seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) int64 ``[n, seq_len]``: byte windows and their next-byte targets."""
    xs, ys = [], []
    for doc in docs:
        arr = np.frombuffer(doc, dtype=np.uint8)
        for s in window_starts(len(arr), seq_len, stride):
            chunk = arr[s : s + seq_len + 1].astype(np.int64)
            xs.append(chunk[:-1])
            ys.append(chunk[1:])
    if not xs:
        empty = np.zeros((0, seq_len), dtype=np.int64)
        return empty, empty.copy()
    return np.stack(xs), np.stack(ys)


def holdout_documents(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (keep, holdout) of ``n`` documents: a seeded permutation sends ceil(n*f) to holdout."""
    perm = np.random.default_rng(seed).permutation(n)
    k = min(math.ceil(n * fraction), max(n - 1, 0))
    return np.sort(perm[k:]), np.sort(perm[:k])


def load_text_splits(cfg: DatasetConfig, root: Path, seed: int) -> Splits:
    """Byte windows of the corpus: train / val (held-out train documents) / test (eval file)."""
    t = cfg.text
    base = root / cfg.path
    train_docs = [b for _, b in read_documents(base / t.train_file)]
    eval_docs = [b for _, b in read_documents(base / t.eval_file)]
    keep, hold = holdout_documents(len(train_docs), t.holdout_fraction, seed)
    stride = t.stride or t.seq_len

    def ds(docs: list[bytes], step: int) -> TensorDataset:
        x, y = cut_windows(docs, t.seq_len, step)
        return _tensors(x, y)

    # Validation and test windows never overlap: each target byte is scored once (bar the tail).
    return Splits(train=ds([train_docs[i] for i in keep], stride),
                  val=ds([train_docs[i] for i in hold], t.seq_len),
                  test=ds(eval_docs, t.seq_len))
