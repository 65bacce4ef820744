"""MLflow pyfunc wrapper around a text classifier's ``torch.export`` program (models-from-code file).

MLflow copies this file into the logged model, so it imports no project code. ``meta.json`` holds the
model's own tokenizer (``tokenizer.json``'s text, as ``tokenizers`` serialises it), ``max_length``,
the pad id and the class labels. ``predict`` takes a DataFrame with a column ``text``, tokenizes it as
``tasks/text_classification.py`` does in training (truncated to ``max_length``, special tokens
added), packs each chunk of rows to its longest (count, then ids) and returns the labels, or with
``params={"predict_method": "predict_proba"}`` a DataFrame of class probabilities, a column per class.
"""

import json

import mlflow
import numpy as np
import pandas as pd

# Rows per program call: bounds the memory of a large request (a chunk is padded to its longest row).
CHUNK = 64


class ExportedTextClassifier(mlflow.pyfunc.PythonModel):
    """Predicts one class label per row of a DataFrame whose ``text`` column holds the raw text."""

    def load_context(self, context):
        import torch
        from tokenizers import Tokenizer

        self._torch = torch
        with open(context.artifacts["meta"]) as fh:
            meta = json.load(fh)
        self.tokenizer = Tokenizer.from_str(meta["tokenizer"])
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(int(meta["max_length"]))
        self.pad_id = int(meta["pad_id"])
        labels = meta["class_labels"]
        self.class_labels = np.asarray(labels, dtype=object if any(isinstance(c, str) for c in labels) else np.int64)
        self.threshold = meta.get("threshold")
        self.program = torch.export.load(context.artifacts["model"]).module()

    def _logits(self, texts: list) -> np.ndarray:
        torch, out = self._torch, []
        for start in range(0, len(texts), CHUNK):
            ids = [e.ids for e in self.tokenizer.encode_batch(texts[start:start + CHUNK])]
            x = np.full((len(ids), 1 + max(max(len(i) for i in ids), 1)), self.pad_id, dtype=np.int64)
            for row, seq in enumerate(ids):
                x[row, 0] = len(seq)
                x[row, 1:1 + len(seq)] = seq
            with torch.inference_mode():
                out.append(self.program(torch.from_numpy(x)).float().numpy())
        return np.concatenate(out)

    def predict(self, context, model_input: pd.DataFrame, params=None):
        method = (params or {}).get("predict_method") or "predict"
        if method not in ("predict", "predict_proba"):
            raise ValueError(f"params.predict_method: must be one of predict, predict_proba, got {method!r}")
        if not isinstance(model_input, pd.DataFrame) or "text" not in model_input.columns:
            raise ValueError("expected a DataFrame with a column 'text' of raw text")
        column = model_input["text"]
        missing = column.isna().to_numpy()
        if missing.any():
            raise ValueError(f"row {int(np.flatnonzero(missing)[0])}: column 'text' has no text")
        if len(model_input) == 0:
            return (pd.DataFrame(np.empty((0, len(self.class_labels))), columns=self.class_labels.tolist())
                    if method == "predict_proba" else np.empty(0, dtype=self.class_labels.dtype))
        proba = _softmax(self._logits([str(v) for v in column.tolist()]))
        if method == "predict_proba":
            return pd.DataFrame(proba, columns=self.class_labels.tolist())
        if self.threshold is not None and proba.shape[1] == 2:
            return self.class_labels[(proba[:, 1] >= self.threshold).astype(np.int64)]
        return self.class_labels[proba.argmax(axis=1)]


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Class probabilities in float64, computed as ``tasks/metrics.py``'s ``softmax``."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


mlflow.models.set_model(ExportedTextClassifier())
