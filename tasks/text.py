"""A text corpus as JSON Lines (``{"path": ..., "text": ...}`` per line), cut into byte windows:
``x`` int64 ``[n, seq_len]`` and ``y`` the same window shifted by one byte (next-byte targets)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from core.errors import DataUnavailableError
from tasks.splits import Splits, tensors


def read_records(path: Path, keys: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The JSON Lines file's records as tuples of ``keys``' strings, in file order; DataUnavailableError
    naming the file and line when the file is missing or a line lacks a key."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DataUnavailableError(f"cannot read {path}: {exc.strerror}; run `dvc pull`") from None
    out = []
    for i, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            values = tuple(obj[k] for k in keys)
            if not all(isinstance(v, str) for v in values):
                raise TypeError("not a string")
        except (ValueError, KeyError, TypeError) as exc:
            raise DataUnavailableError(f"{path}:{i}: not a JSON object with string {', '.join(map(repr, keys))} "
                                       f"({type(exc).__name__}: {exc})") from None
        out.append(values)
    return out


def read_documents(path: Path) -> list[tuple[str, bytes]]:
    """``[(doc path, UTF-8 bytes)]`` of a JSON Lines corpus file of ``{"path", "text"}`` objects."""
    return [(doc, text.encode("utf-8")) for doc, text in read_records(path, ("path", "text"))]


def corpus_files(cfg, root: Path) -> dict[str, Path]:
    """``dataset.text``'s JSON Lines files: ``{"train", "eval"}``."""
    base = Path(root) / cfg.dataset.path
    return {"train": base / cfg.dataset.text.train_file, "eval": base / cfg.dataset.text.eval_file}


class Corpus:
    """What the text tasks share (mixed in before ``Task``): their splits are ``dataset.text``'s files."""

    def data_splits(self, cfg) -> dict[str, tuple[str, str]]:
        base, text = cfg.dataset.path.rstrip("/"), cfg.dataset.text
        return {"train": (f"{base}/{text.train_file}", "training"), "eval": (f"{base}/{text.eval_file}", "testing")}

    def eval_key(self, cfg, root: Path, **parts) -> dict:
        """The scoring key of the eval file's bytes, ``self.metrics_version`` and ``parts``."""
        from core.hashing import file_sha256, sha256_json

        split = file_sha256(corpus_files(cfg, root)["eval"])
        key = sha256_json({**parts, "split_sha256": split, "metrics_version": self.metrics_version})
        return {"key": key, "split_sha256": split, "metrics_version": self.metrics_version}


def window_starts(n_tokens: int, seq_len: int, stride: int) -> list[int]:
    """Starts of full windows (seq_len + 1 bytes) over a document of ``n_tokens`` bytes: every ``stride``
    bytes, plus one ending at its last byte when the strided ones stop short of it."""
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


def load_text_splits(cfg, root: Path, seed: int) -> Splits:
    """Byte windows of the corpus: train, val (a seeded ``holdout_fraction`` of the train file's
    documents) and test (the eval file)."""
    t = cfg.text
    base = root / cfg.path
    train_docs = [b for _, b in read_documents(base / t.train_file)]
    eval_docs = [b for _, b in read_documents(base / t.eval_file)]
    keep, hold = holdout_documents(len(train_docs), t.holdout_fraction, seed)
    stride = t.stride or t.seq_len

    def ds(docs: list[bytes], step: int):
        return tensors(*cut_windows(docs, t.seq_len, step))

    # Validation and test windows never overlap: each target byte is scored once (bar the tail).
    return Splits(train=ds([train_docs[i] for i in keep], stride),
                  val=ds([train_docs[i] for i in hold], t.seq_len),
                  test=ds(eval_docs, t.seq_len))
