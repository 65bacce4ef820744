"""Evaluating a fine-tuned causal LM (the ``causal_lm`` task) on its eval records: held-out loss and
perplexity, token-weighted over every learned target (a text's tokens and EOS; a pair's completion
and EOS), per record in the windows of ``record_targets`` (``tasks.pyfunc_common.score_records``, which
the registered pyfunc runs for ``predict_method: score``, so a rescored champion compares with it).
The summary and the champion comparison are the ``lm`` task's (``tasks.lm_eval.summarise``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.lm_eval import summarise, write_report
from tasks.pyfunc_common import score_records

# The fine-tuned model folder (safetensors + tokenizer) in the training folder, beside model.pt2.
EXPORT_DIR = "hf_model"


def summary(loss_sum, n_tokens) -> dict:
    """Token-weighted loss and perplexity (``tasks.lm_eval.summarise`` without its bytes)."""
    out = summarise(np.asarray(loss_sum, dtype=np.float64), np.asarray(n_tokens, dtype=np.int64))
    out.pop("bits_per_byte")
    return {**out, "kind": "causal_lm"}


def score_champion(task, cfg, root: Path, predictor, records=None) -> dict:
    """A registered causal LM (a loaded pyfunc, ``predictor.pyfunc``) scored on this run's eval records
    through its ``score`` method."""
    import pandas as pd

    records = task.eval_records(cfg, root) if records is None else records
    frame = pd.DataFrame({"text": [r[0] for r in records]})
    if records and len(records[0]) == 2:
        frame["completion"] = [r[1] for r in records]
    out = predictor.pyfunc.predict(frame, params={"predict_method": "score"})
    n_tok = np.asarray(out["n_tokens"], dtype=np.int64)
    return summary(np.nan_to_num(np.asarray(out["loss"], dtype=np.float64)) * n_tok, n_tok)


def evaluate(task, cfg, root: Path, train_dir: Path, out_dir: Path, champion=None,
                    champion_metrics: dict | None = None) -> dict:
    """The causal_lm task's evaluator: loss and perplexity of ``train_dir``'s exported model folder and of the
    champion (``champion_metrics`` when recorded, else the ``champion`` pyfunc's ``score``) on the eval
    records; writes ``metrics.json`` into ``out_dir``."""
    import torch

    from tasks.base import champion_scores
    from tasks.hf_folder import load_model, load_tokenizer
    from tasks.metrics import latency_p95_ms

    torch.set_num_threads(1)
    folder = Path(train_dir) / EXPORT_DIR
    tok, model = load_tokenizer(folder), load_model(folder, "causal_lm").eval()
    records = task.eval_records(cfg, root)
    loss_sum, n_tok = score_records(model, tok, records, cfg.pretrained.max_length)
    cand = summary(loss_sum, n_tok)
    window = np.random.default_rng(0).integers(0, len(tok), (1, cfg.pretrained.max_length), dtype=np.int64)
    with torch.inference_mode():  # one random full window: a forward pass's time
        cand["latency_p95_ms"] = latency_p95_ms(lambda x: model(input_ids=torch.from_numpy(x), use_cache=False),
                                                window, 20, 3)
    per_record = [{"record": i, "n_tokens": int(k), "loss": float(s / k) if k else None}
                  for i, (s, k) in enumerate(zip(loss_sum, n_tok))]
    champ = champion_scores(champion_metrics, champion, lambda c: score_champion(task, cfg, root, c, records))
    return write_report(task, cfg, root, out_dir, cand, champ, per_record=per_record)
