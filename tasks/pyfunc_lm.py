"""MLflow pyfunc wrapper scoring text with a byte-level language model (models-from-code file).

MLflow copies this file into the logged model, so it imports no project code. Input: a DataFrame
with a ``text`` column (or a list of strings). Output per document: ``loss`` (mean cross-entropy
per target byte, nats; NaN under two bytes), ``perplexity`` and ``n_tokens``, in the windows of
``tasks.lm_eval.windows`` (kept in step by a test).
"""

import json

import mlflow
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

BATCH_WINDOWS = 64


def _windows(doc, seq_len):
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
        mask[-1, : seq_len - (n_targets - covered)] = False
    return xs, ys, mask


class TextScorer(mlflow.pyfunc.PythonModel):
    """Per-document loss and perplexity of a DataFrame's ``text`` column."""

    def load_context(self, context):
        with open(context.artifacts["meta"]) as fh:
            meta = json.load(fh)
        self.seq_len = int(meta["seq_len"])
        self.program = torch.export.load(context.artifacts["model"]).module()

    def predict(self, context, model_input: pd.DataFrame, params=None):
        if isinstance(model_input, pd.DataFrame):
            if "text" not in model_input.columns:
                raise ValueError(f"expected a 'text' column, got {list(model_input.columns)[:5]}")
            texts = model_input["text"].tolist()
        else:
            texts = list(model_input)
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise ValueError(f"text must be strings; rows {bad[:5]} are not")
        parts = [_windows(t.encode("utf-8", "surrogatepass"), self.seq_len) for t in texts]
        counts = [len(p[0]) for p in parts]
        owner = np.repeat(np.arange(len(texts)), counts)
        empty = np.zeros((0, self.seq_len), dtype=np.int64)
        x = np.concatenate([p[0] for p in parts] + [empty])
        y = np.concatenate([p[1] for p in parts] + [empty])
        mask = np.concatenate([p[2] for p in parts] + [empty.astype(bool)])
        per_window = np.zeros(len(x), dtype=np.float64)
        with torch.inference_mode():
            for s in range(0, len(x), BATCH_WINDOWS):
                logits = self.program(torch.from_numpy(x[s : s + BATCH_WINDOWS])).float()
                nll = F.cross_entropy(logits.transpose(1, 2), torch.from_numpy(y[s : s + BATCH_WINDOWS]),
                                      reduction="none").double().numpy()
                per_window[s : s + BATCH_WINDOWS] = (nll * mask[s : s + BATCH_WINDOWS]).sum(1)
        loss_sum = np.bincount(owner, weights=per_window, minlength=len(texts))
        n_tokens = np.bincount(owner, weights=mask.sum(1), minlength=len(texts)).astype(np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            loss = np.where(n_tokens > 0, loss_sum / np.maximum(n_tokens, 1), np.nan)
        return pd.DataFrame({"loss": loss, "perplexity": np.exp(loss), "n_tokens": n_tokens})


mlflow.models.set_model(TextScorer())
