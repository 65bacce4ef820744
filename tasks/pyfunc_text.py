"""MLflow pyfunc wrapper of a fine-tuned text classifier (models-from-code file): raw text in, the
label's own values (or class probabilities) out.

MLflow copies this file into the logged model (with ``pyfunc_common``), so it imports no other project
code. The ``model`` artifact is the folder ``tasks/text_classification.py`` exports: the weights as
safetensors (``save_pretrained``; under mean pooling the encoder alone, its linear head in
``meta["head_file"]``), the config and the tokenizer files, each hashed by the registry at registration;
it loads offline, from that folder only, never with remote code. ``meta.json`` holds ``max_length``, the
pad id, the pooling and the class labels. ``predict`` takes a DataFrame with a column ``text``,
tokenizes it as training does (``tokenizer.json``, truncated to ``max_length``, special tokens added),
pads each chunk of rows to its longest and returns the labels, or with ``params={"predict_method":
"predict_proba"}`` a DataFrame of class probabilities, a column per class.
"""

import os
import sys

import mlflow
import numpy as np
import pandas as pd

sys.modules.pop("pyfunc_common", None)  # this model's own copy: MLflow puts its code/ first on sys.path
import pyfunc_common as common  # noqa: E402


class ExportedTextClassifier(mlflow.pyfunc.PythonModel):
    """Predicts one class label per row of a DataFrame whose ``text`` column holds the raw text."""

    def load_context(self, context):
        common.offline()
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModel, AutoModelForSequenceClassification

        self._torch = torch
        meta = common.meta(context)
        folder = context.artifacts["model"]
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(int(meta["max_length"]))
        self.pad_id = int(meta["pad_id"])
        self.class_labels = common.labels(meta["class_labels"])
        self.threshold = meta.get("threshold")
        self.head = None
        if meta["pooling"] == "mean":
            from safetensors.torch import load_file

            self.model = common.load_weights(AutoModel, folder)
            if getattr(self.model, "pooler", None) is not None:
                self.model.pooler = None  # [CLS]'s pooler: not trained, not read under mean pooling
            self.head = load_file(os.path.join(folder, meta["head_file"]))
        else:
            self.model = common.load_weights(AutoModelForSequenceClassification, folder)

    def _logits(self, texts: list):
        """One chunk's logits, its rows padded to its longest."""
        torch = self._torch
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        x = np.full((len(ids), max(max(len(i) for i in ids), 1)), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(x)
        for row, seq in enumerate(ids):
            x[row, :len(seq)], mask[row, :len(seq)] = seq, 1
        x, mask = torch.from_numpy(x), torch.from_numpy(mask)
        hidden = self.model(input_ids=x, attention_mask=mask)
        if self.head is None:
            return hidden.logits
        # the mean of the text's token states, then the linear head
        weights = mask.unsqueeze(-1).to(hidden.last_hidden_state.dtype)
        pooled = (hidden.last_hidden_state * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return torch.nn.functional.linear(pooled, self.head["weight"], self.head["bias"])

    def predict(self, context, model_input: pd.DataFrame, params=None):
        method = common.method(params)
        logits = common.forward(self._logits, common.texts(model_input))
        return common.classes(logits, self.class_labels, method, self.threshold)


mlflow.models.set_model(ExportedTextClassifier())
