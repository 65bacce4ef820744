"""MLflow pyfunc wrapper around a ``torch.export`` program (models-from-code file).

MLflow copies this file into the logged model and runs it at load time, so it
imports only mlflow, torch, pandas and numpy: no project code. MLflow also runs it
when the model is *logged*; torch is imported in ``load_context`` so that logging
costs no torch import (the pipeline process has no other use for torch). The program
(``model.pt2``) maps float32 ``[batch, n_features]`` raw feature values (standardisation is
inside it) to ``[batch, n_outputs]``; ``meta.json`` holds the feature column order and what
the outputs mean: ``output: label`` (one logit per class; ``class_labels`` in order, ints or
strings) or ``output: value`` (a regression's prediction, in the target's units).
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
            frame = model_input[self.feature_columns]
            try:
                values = frame.to_numpy(dtype=np.float32)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"feature columns must be numeric: {exc}") from None
        else:
            values = np.asarray(model_input, dtype=np.float32)
        if values.ndim != 2 or values.shape[1] != len(self.feature_columns):
            raise ValueError(
                f"expected [rows, {len(self.feature_columns)}] features, got {list(values.shape)}"
            )
        if values.shape[0] == 0:
            return np.empty(0, dtype=np.float64 if self.class_labels is None else self.class_labels.dtype)
        if np.isinf(values).any():
            # NaN is a missing value: the program imputes it with the train mean (its first layer).
            raise ValueError("features contain infinite values")
        torch = self._torch
        with torch.inference_mode():
            # torch.tensor copies: pandas may hand back a read-only view.
            logits = self.program(torch.tensor(values))
        if self.class_labels is None:  # a regression: the one output, in the target's units
            return logits[:, 0].double().numpy()
        return self.class_labels[logits.argmax(dim=1).numpy()]


mlflow.models.set_model(ExportedTable())
