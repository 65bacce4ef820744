"""MLflow pyfunc wrapper around a table's ``torch.export`` program (models-from-code file).

MLflow copies this file into the logged model (with ``pyfunc_common`` and ``tasks/encoding.py``), so
it imports no other project code; it also runs it when the model is logged, so torch is imported
only where the program runs. The program maps float32 encoded rows to ``[batch, n_outputs]``;
``meta.json`` holds the feature columns with their kind (categorical ones with their vocabulary) and
``output``: ``label`` (``class_labels`` in order) or ``value`` (a regression's, in the target's
units), and a binary classifier's ``threshold`` (class 1 where its probability is at least that).
``predict`` takes the raw DataFrame a client has and encodes it with ``encoding`` as training did; a
classifier returns labels, or with ``params={"predict_method": "predict_proba"}`` a DataFrame of
class probabilities, a column per class named by its label.
"""

import sys

import mlflow
import numpy as np
import pandas as pd

# This model's own copies (MLflow puts its code/ first on sys.path), not those an earlier load cached.
for _name in ("pyfunc_common", "encoding"):
    sys.modules.pop(_name, None)
import encoding  # noqa: E402
import pyfunc_common as common  # noqa: E402


class ExportedTable(mlflow.pyfunc.PythonModel):
    """Predicts one class label, or one value, per row of a DataFrame of the feature columns."""

    def load_context(self, context):
        meta = common.meta(context)
        # A meta naming only the feature columns: every column numeric.
        self.columns = meta.get("columns") or [{"name": c, "kind": "numeric"} for c in meta["feature_columns"]]
        self.class_labels = common.labels(meta.get("class_labels"))
        self.threshold = meta.get("threshold")
        self.program = common.program(context)

    # The pd.DataFrame hint keeps MLflow from inferring a schema from type hints; arrays are accepted too.
    def predict(self, context, model_input: pd.DataFrame, params=None):
        method = common.method(params, ("predict",) if self.class_labels is None else ("predict", "predict_proba"))
        if isinstance(model_input, pd.DataFrame):
            values = encoding.encode(model_input, self.columns)
        else:
            values = np.asarray(model_input, dtype=np.float32)
        if values.ndim != 2 or values.shape[1] != len(self.columns):
            raise ValueError(f"expected [rows, {len(self.columns)}] features, got {list(values.shape)}")
        if np.isinf(values).any():
            # NaN is a missing value: the program imputes it (its first layer).
            raise ValueError("features contain infinite values")
        if self.class_labels is None:  # a regression: the one output, in the target's units
            return common.forward(lambda x: self.program(x)[:, 0], values, rows=common.PROGRAM_ROWS)
        logits = common.forward(self.program, values, rows=common.PROGRAM_ROWS)
        return common.classes(logits, self.class_labels, method, self.threshold)


mlflow.models.set_model(ExportedTable())
