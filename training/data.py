"""Loading the dataset splits into tensors, and the deterministic train/val split.

What the tensors hold is the task's (``tasks``): a table's features float32 ``[n, f]`` and
class indices or standardised targets; for the ``lm`` task byte tokens. Each document's UTF-8 bytes are cut into windows;
``x`` is int64 ``[n, seq_len]`` (bytes 0..255) and ``y`` the same window shifted by one byte
(next-token targets). ``train`` holds windows of the train file's documents minus a seeded
``holdout_fraction`` of them, which form ``val`` (per-epoch validation); ``test`` holds the
eval file's documents (the evaluation gate's split).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.config import DatasetConfig, PipelineConfig
from tasks.text import read_documents  # noqa: F401  (the corpus reader, torch-free)
# The splits' types live in their own module, which the streamed source builds too.
from training.splits import Splits, tensors  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from torch.utils.data import TensorDataset


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


def load_splits(cfg: PipelineConfig, root: Path, seed: int, data_md5: str | None = None) -> Splits:
    """The train / val / test tensors of ``cfg``'s task. Raises DataUnavailableError.

    With ``training.loader.kind`` ``stream`` (or ``auto`` on a train split above
    ``stream_above_mb``) a table's ``train`` is a ``training.stream.StreamSource`` instead; the
    choice is logged. ``data_md5`` (the DVC md5) keys a large CSV's Parquet copy in the cache.
    """
    import logging

    from core.errors import ConfigError
    from tasks import get_task

    task = get_task(cfg.task)
    if cfg.training.loader.kind in ("stream", "auto"):
        from training.stream import choose_loader, stream_splits

        if not hasattr(task, "stream_info"):  # a task that reads no table (the byte LM) loads in memory
            if cfg.training.loader.kind == "stream":
                raise ConfigError(f"training.loader.kind: 'stream' reads tables; task {cfg.task!r} has none "
                                  "(use memory or auto)")
            kind, why = "memory", f"auto: task {cfg.task!r} has no table to stream"
        else:
            kind, why = choose_loader(cfg, root)
        logging.getLogger("trainflow.train").info("training.loader: %s (%s)", kind, why)
        if kind == "stream":
            return stream_splits(cfg, root, seed, data_md5 or "")
    return task.load_data(cfg, root, seed)


# -- text ---------------------------------------------------------------------------------
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
        return tensors(x, y)

    # Validation and test windows never overlap: each target byte is scored once (bar the tail).
    return Splits(train=ds([train_docs[i] for i in keep], stride),
                  val=ds([train_docs[i] for i in hold], t.seq_len),
                  test=ds(eval_docs, t.seq_len))
