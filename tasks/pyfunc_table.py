"""MLflow pyfunc wrapper around a ``torch.export`` program (models-from-code file).

MLflow copies this file into the logged model and runs it at load time, so it
imports only mlflow, torch, pandas and numpy: no project code. MLflow also runs it
when the model is *logged*; torch is imported in ``load_context`` so that logging
costs no torch import (the pipeline process has no other use for torch). The program
(``model.pt2``) maps float32 ``[batch, n_features]`` encoded rows (the transforms and the
imputation are inside it) to ``[batch, n_outputs]``; ``meta.json`` holds the feature columns in
order with their kind (numeric, or categorical with its vocabulary of text forms) and what the
outputs mean: ``output: label`` (one logit per class; ``class_labels`` in order, ints or strings)
or ``output: value`` (a regression's prediction, in the target's units).

``predict`` takes the raw DataFrame a client has: numbers, strings, booleans, missing values
(NaN/None). A category is encoded as trainflow's ``tasks/encoding.py`` does (the same text
form: 3, 3.0 and "3" are one category; an unseen value is "other", a missing one "missing");
``tests/unit/test_table_encoding.py`` checks that the two agree.
"""

import json

import mlflow
import numpy as np
import pandas as pd


class ExportedTable(mlflow.pyfunc.PythonModel):
    """Predicts one class label, or one value, per row of a DataFrame of the feature columns."""

    def load_context(self, context):
        import torch

        self._torch = torch
        with open(context.artifacts["meta"]) as fh:
            meta = json.load(fh)
        self.feature_columns = list(meta["feature_columns"])
        # Older models (before categorical columns) list only the names: every column numeric.
        self.columns = meta.get("columns") or [{"name": c, "kind": "numeric"} for c in self.feature_columns]
        codes = meta.get("codes") or {"missing": 0, "other": 1, "first": 2}
        self.codes = (codes["missing"], codes["other"], codes["first"])
        self.vocab = {c["name"]: pd.Index(c["values"], dtype=object) for c in self.columns
                      if c["kind"] == "categorical"}
        labels = meta.get("class_labels")
        self.class_labels = None if labels is None else np.asarray(labels, dtype=object if any(
            isinstance(c, str) for c in labels) else np.int64)
        self.program = torch.export.load(context.artifacts["model"]).module()

    # The pd.DataFrame hint only tells MLflow not to infer a schema from type
    # hints (the signature comes from log time); arrays are accepted too.
    def predict(self, context, model_input: pd.DataFrame, params=None):
        if isinstance(model_input, pd.DataFrame):
            missing = [c for c in self.feature_columns if c not in model_input.columns]
            if missing:
                raise ValueError(f"missing feature columns: {missing[:5]}")
            values = np.empty((len(model_input), len(self.columns)), dtype=np.float32)
            for j, col in enumerate(self.columns):
                s = model_input[col["name"]]
                if col["kind"] == "categorical":
                    values[:, j] = self._codes(s, self.vocab[col["name"]])
                    continue
                try:
                    values[:, j] = s.to_numpy(dtype=np.float64, na_value=np.nan)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"feature column {col['name']!r} must be numeric: {exc}") from None
        else:
            values = np.asarray(model_input, dtype=np.float32)
        if values.ndim != 2 or values.shape[1] != len(self.feature_columns):
            raise ValueError(
                f"expected [rows, {len(self.feature_columns)}] features, got {list(values.shape)}"
            )
        if values.shape[0] == 0:
            return np.empty(0, dtype=np.float64 if self.class_labels is None else self.class_labels.dtype)
        if np.isinf(values).any():
            # NaN is a missing value: the program imputes it (its first layer).
            raise ValueError("features contain infinite values")
        torch = self._torch
        with torch.inference_mode():
            # torch.tensor copies: pandas may hand back a read-only view.
            logits = self.program(torch.tensor(values))
        if self.class_labels is None:  # a regression: the one output, in the target's units
            return logits[:, 0].double().numpy()
        return self.class_labels[logits.argmax(dim=1).numpy()]

    def _codes(self, s: pd.Series, vocab: pd.Index) -> np.ndarray:
        """A categorical column's codes: its values' text forms looked up in the vocabulary."""
        missing, other, first = self.codes
        if pd.api.types.is_bool_dtype(s.dtype):
            keys = np.where(s.to_numpy(dtype=bool, na_value=False), "True", "False").astype(object)
        elif pd.api.types.is_numeric_dtype(s.dtype):
            v = s.to_numpy(dtype=np.float64, na_value=np.nan)
            keys = v.astype(str).astype(object)
            whole = np.isfinite(v) & (np.abs(v) < 2**53)
            whole[whole] = v[whole] == np.round(v[whole])
            keys[whole] = v[whole].astype(np.int64).astype(str)
        else:
            keys = s.map(_text, na_action="ignore").to_numpy(dtype=object)
        at = vocab.get_indexer(keys) if len(vocab) else np.full(len(keys), -1)
        codes = np.where(at >= 0, at + first, other).astype(np.float32)
        codes[s.isna().to_numpy()] = missing
        return codes


def _text(v) -> str:
    """A category's text form: True/False, whole numbers without ".0", else str()."""
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    if isinstance(v, (float, np.floating)) and float(v).is_integer() and abs(v) < 2**53:
        return str(int(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return str(v)


mlflow.models.set_model(ExportedTable())
