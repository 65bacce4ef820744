"""MLflow pyfunc wrapper scoring text with a byte-level language model (models-from-code file).

MLflow copies this file into the logged model (with ``pyfunc_common``), so it imports no other
project code. Input: a DataFrame with a ``text`` column (or a list of strings). Output per document:
``loss`` (mean cross-entropy per target byte, nats; NaN under two bytes), ``perplexity`` and
``n_tokens``, in the windows of ``tasks.lm_eval.windows`` (kept in step by a test).
"""

import sys

import mlflow
import numpy as np
import pandas as pd
import torch.nn.functional as F

sys.modules.pop("pyfunc_common", None)  # this model's own copy: MLflow puts its code/ first on sys.path
import pyfunc_common as common  # noqa: E402


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
        self.seq_len = int(common.meta(context)["seq_len"])
        self.program = common.program(context)

    def predict(self, context, model_input: pd.DataFrame, params=None):
        texts = common.texts(model_input)
        parts = [_windows(t.encode("utf-8", "surrogatepass"), self.seq_len) for t in texts]
        counts = [len(p[0]) for p in parts]
        owner = np.repeat(np.arange(len(texts)), counts)
        empty = np.zeros((0, self.seq_len), dtype=np.int64)
        x = np.concatenate([p[0] for p in parts] + [empty])
        y = np.concatenate([p[1] for p in parts] + [empty])
        mask = np.concatenate([p[2] for p in parts] + [empty.astype(bool)])
        nll = common.forward(lambda xb, yb: F.cross_entropy(self.program(xb).float().transpose(1, 2), yb,
                                                             reduction="none"), x, y)
        per_window = (nll * mask).sum(1) if len(x) else np.zeros(0)
        loss_sum = np.bincount(owner, weights=per_window, minlength=len(texts))
        n_tokens = np.bincount(owner, weights=mask.sum(1), minlength=len(texts)).astype(np.int64)
        return common.scores(loss_sum, n_tokens)


mlflow.models.set_model(TextScorer())
