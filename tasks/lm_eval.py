"""The lm task's evaluator (``LanguageModel.evaluator``): a byte-level language model scored on the eval
documents: loss, perplexity, bits per byte.

Every target byte of a document is scored exactly once, in windows of ``seq_len`` tokens:
non-overlapping windows from the start, the last one shifted back to end at the document's end
(its already-scored targets masked out), and a document shorter than one window padded on the
right. A document of n bytes has n - 1 targets. The registered pyfunc (``tasks/pyfunc_lm.py``)
scores with the same rule, so the candidate's figures and the champion's compare.

Metrics are token-weighted over all documents: ``loss`` is the mean cross-entropy per target byte
in nats, ``perplexity = exp(loss)``, ``bits_per_byte = loss / ln 2``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from tasks.base import LoadedModel

BATCH_WINDOWS = 64


def windows(doc: bytes, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, mask) int64/int64/bool ``[w, seq_len]`` covering every target of ``doc`` once."""
    arr = np.frombuffer(doc, dtype=np.uint8).astype(np.int64)
    n_targets = len(arr) - 1
    if n_targets <= 0:
        z = np.zeros((0, seq_len), dtype=np.int64)
        return z, z.copy(), np.zeros((0, seq_len), dtype=bool)
    if n_targets <= seq_len:
        x = np.zeros((1, seq_len), dtype=np.int64)
        y = np.zeros((1, seq_len), dtype=np.int64)
        x[0, :n_targets], y[0, :n_targets] = arr[:-1], arr[1:]
        mask = np.zeros((1, seq_len), dtype=bool)
        mask[0, :n_targets] = True
        return x, y, mask
    starts = list(range(0, n_targets - seq_len + 1, seq_len))
    covered = starts[-1] + seq_len
    if covered < n_targets:
        starts.append(n_targets - seq_len)
    xs = np.stack([arr[s : s + seq_len] for s in starts])
    ys = np.stack([arr[s + 1 : s + seq_len + 1] for s in starts])
    mask = np.ones_like(xs, dtype=bool)
    if covered < n_targets:
        mask[-1, : seq_len - (n_targets - covered)] = False  # scored by the previous window
    return xs, ys, mask


def score_documents(module, docs: Sequence[bytes], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-document (summed cross-entropy in nats, number of targets) under ``module`` (int64
    ``[batch, seq_len]`` tokens -> logits ``[batch, seq_len, vocab]``)."""
    import torch
    import torch.nn.functional as F

    parts = [windows(d, seq_len) for d in docs]
    owner = np.repeat(np.arange(len(parts)), [len(p[0]) for p in parts])
    empty = np.zeros((0, seq_len), dtype=np.int64)
    x = np.concatenate([p[0] for p in parts] + [empty])
    y = np.concatenate([p[1] for p in parts] + [empty])
    mask = np.concatenate([p[2] for p in parts] + [empty.astype(bool)])
    per_window = np.zeros(len(x), dtype=np.float64)
    with torch.inference_mode():
        for s in range(0, len(x), BATCH_WINDOWS):
            logits = module(torch.from_numpy(x[s : s + BATCH_WINDOWS])).float()
            nll = F.cross_entropy(logits.transpose(1, 2), torch.from_numpy(y[s : s + BATCH_WINDOWS]),
                                  reduction="none").double().numpy()
            per_window[s : s + BATCH_WINDOWS] = (nll * mask[s : s + BATCH_WINDOWS]).sum(1)
    loss_sum = np.bincount(owner, weights=per_window, minlength=len(docs))
    n_tokens = np.bincount(owner, weights=mask.sum(1), minlength=len(docs)).astype(np.int64)
    return loss_sum, n_tokens


def summarise(loss_sum: np.ndarray, n_tokens: np.ndarray) -> dict:
    """Token-weighted loss, perplexity and bits per byte over documents."""
    n = int(np.sum(n_tokens))
    loss = float(np.sum(loss_sum) / n) if n else float("nan")
    return {"kind": "lm", "loss": loss, "perplexity": math.exp(loss) if n else float("nan"),
            "bits_per_byte": loss / math.log(2) if n else float("nan"), "n_tokens": n,
            "n_docs": int(len(n_tokens))}


def _documents(cfg, root: Path) -> list[tuple[str, bytes]]:
    from tasks.text import corpus_files, read_documents

    return read_documents(corpus_files(cfg, root)["eval"])


def score_champion(task, cfg, root: Path, scorer, docs: list[tuple[str, bytes]] | None = None) -> dict:
    """A registered language model's figures (``scorer``: texts -> (loss [n], n_tokens [n])) on this
    run's eval documents."""
    docs = _documents(cfg, root) if docs is None else docs
    loss, n_tok = scorer([d.decode("utf-8") for _, d in docs])
    n_tok = np.asarray(n_tok, dtype=np.int64)
    return summarise(np.nan_to_num(np.asarray(loss, dtype=np.float64)) * n_tok, n_tok)


def evaluate(task, cfg, root: Path, train_dir: Path, out_dir: Path, champion=None,
                       champion_metrics: dict | None = None) -> dict:
    """The lm task's evaluation: loss / perplexity / bits per byte of
    ``train_dir/model.pt2`` and of the champion (``champion_metrics`` when recorded, else the
    ``champion`` scorer's) on the eval documents; writes ``metrics.json`` into ``out_dir``."""
    import torch

    from tasks.base import champion_scores, load_program
    from tasks.metrics import latency_p95_ms

    torch.set_num_threads(1)
    seq_len = cfg.dataset.text.seq_len
    docs = _documents(cfg, root)
    module = load_program(Path(train_dir) / "model.pt2")
    loss_sum, n_tok = score_documents(module, [d for _, d in docs], seq_len)
    cand = summarise(loss_sum, n_tok)
    window = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (1, seq_len), dtype=np.int64))
    with torch.inference_mode():  # one random window, 100 timed calls after 10
        cand["latency_p95_ms"] = latency_p95_ms(module, window, 100, 10)
    per_doc = [{"path": p, "n_tokens": int(k), "loss": float(s / k) if k else None}
               for (p, _), s, k in zip(docs, loss_sum, n_tok)]
    champ = champion_scores(champion_metrics, champion, lambda c: score_champion(task, cfg, root, c, docs))
    return write_report(task, cfg, root, out_dir, cand, champ, per_document=per_doc)


def write_report(task, cfg, root: Path, out_dir: Path, cand: dict, champ: tuple, **per_item) -> dict:
    """A language model's evaluation report (``champ``: ``champion_scores``' pair; no baseline), written
    to ``out_dir/metrics.json``."""
    report = {"candidate": cand, "champion": champ[0], "champion_scores": champ[1], "baseline": None,
              "files": {}, "scoring_key": task.scoring_key(cfg, root), "candidate_scored_in": "pipeline",
              **per_item}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(report, indent=2))
    return report


class TextScorer(LoadedModel):
    """A loaded registry language model: ``scorer(texts) -> (loss [n], n_tokens [n])`` for strings or a
    DataFrame with a ``text`` column; ``.frame(texts)``: the whole output (loss, perplexity, n_tokens)."""

    def frame(self, texts):
        import pandas as pd

        return self.pyfunc.predict(texts if isinstance(texts, pd.DataFrame) else pd.DataFrame({"text": list(texts)}))

    def __call__(self, texts):
        out = self.frame(texts)
        return np.asarray(out["loss"], dtype=np.float64), np.asarray(out["n_tokens"], dtype=np.int64)
