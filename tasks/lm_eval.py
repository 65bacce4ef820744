"""The lm task's evaluator (``LanguageModel.evaluator``): a byte-level language model scored on the eval
documents: loss, perplexity, bits per byte.

Every target byte of a document is scored exactly once, in windows of ``seq_len`` tokens:
non-overlapping windows from the start, the last one shifted back to end at the document's end
(its already-scored targets masked out), and a document shorter than one window padded on the
right. A document of n bytes has n - 1 targets. The rule is ``tasks.pyfunc_common.windows``, which the
registered pyfunc (``tasks/pyfunc_lm.py``) runs too, so the candidate's figures and the champion's compare.

Metrics are token-weighted over all documents: ``loss`` is the mean cross-entropy per target byte
in nats, ``perplexity = exp(loss)``, ``bits_per_byte = loss / ln 2``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tasks.base import LoadedModel
from tasks.pyfunc_common import score_documents

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
