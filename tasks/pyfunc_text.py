"""MLflow pyfunc wrapper of a fine-tuned text classifier (models-from-code file): raw text in, the
label's own values (or class probabilities) out.

MLflow copies this file into the logged model, so it imports no project code. The ``model`` artifact
is the folder ``tasks/text_classification.py`` exports: the weights as safetensors (``save_pretrained``;
under mean pooling the encoder alone, its linear head in ``meta["head_file"]``), the config and the
tokenizer files, each hashed by the registry at registration; it loads offline, from that folder
only, never with remote code. ``meta.json`` holds ``max_length``, the pad id, the pooling and the
class labels. ``predict`` takes a DataFrame with a column ``text``, tokenizes it as training does
(``tokenizer.json``, truncated to ``max_length``, special tokens added), pads each chunk of rows to its
longest and returns the labels, or with ``params={"predict_method": "predict_proba"}`` a DataFrame of
class probabilities, a column per class.
"""

import json
import os

for _key, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"),
                     ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_key, _value)

import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

# Rows per forward pass: bounds the memory of a large request (a chunk is padded to its longest row).
CHUNK = 64


class ExportedTextClassifier(mlflow.pyfunc.PythonModel):
    """Predicts one class label per row of a DataFrame whose ``text`` column holds the raw text."""

    def load_context(self, context):
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModel, AutoModelForSequenceClassification

        self._torch = torch
        with open(context.artifacts["meta"]) as fh:
            meta = json.load(fh)
        folder = context.artifacts["model"]
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(int(meta["max_length"]))
        self.pad_id = int(meta["pad_id"])
        labels = meta["class_labels"]
        self.class_labels = np.asarray(labels, dtype=object if any(isinstance(c, str) for c in labels) else np.int64)
        self.threshold = meta.get("threshold")
        kwargs = {"local_files_only": True, "trust_remote_code": False, "use_safetensors": True}
        self.head = None
        if meta["pooling"] == "mean":
            from safetensors.torch import load_file

            self.model = AutoModel.from_pretrained(folder, **kwargs).eval()
            if getattr(self.model, "pooler", None) is not None:
                self.model.pooler = None  # [CLS]'s pooler: not trained, not read under mean pooling
            self.head = load_file(os.path.join(folder, meta["head_file"]))
        else:
            self.model = AutoModelForSequenceClassification.from_pretrained(folder, **kwargs).eval()

    def _logits(self, texts: list) -> np.ndarray:
        torch, out = self._torch, []
        for start in range(0, len(texts), CHUNK):
            ids = [e.ids for e in self.tokenizer.encode_batch(texts[start:start + CHUNK])]
            x = np.full((len(ids), max(max(len(i) for i in ids), 1)), self.pad_id, dtype=np.int64)
            mask = np.zeros_like(x)
            for row, seq in enumerate(ids):
                x[row, :len(seq)], mask[row, :len(seq)] = seq, 1
            x, mask = torch.from_numpy(x), torch.from_numpy(mask)
            with torch.inference_mode():
                hidden = self.model(input_ids=x, attention_mask=mask)
                if self.head is None:
                    logits = hidden.logits
                else:  # the mean of the text's token states, then the linear head
                    weights = mask.unsqueeze(-1).to(hidden.last_hidden_state.dtype)
                    pooled = (hidden.last_hidden_state * weights).sum(1) / weights.sum(1).clamp(min=1.0)
                    logits = torch.nn.functional.linear(pooled, self.head["weight"], self.head["bias"])
            out.append(logits.float().numpy())
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
