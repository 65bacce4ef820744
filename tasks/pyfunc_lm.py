"""MLflow pyfunc wrapper scoring text with a byte-level language model (models-from-code file).

MLflow copies this file into the logged model (with ``pyfunc_common``), so it imports no other
project code. Input: a DataFrame with a ``text`` column (or a list of strings). Output per document:
``loss`` (mean cross-entropy per target byte, nats; NaN under two bytes), ``perplexity`` and
``n_tokens``, scored as the evaluation scores (``pyfunc_common.score_documents``).
"""

import sys

import mlflow
import pandas as pd

sys.modules.pop("pyfunc_common", None)  # this model's own copy: MLflow puts its code/ first on sys.path
import pyfunc_common as common  # noqa: E402


class TextScorer(mlflow.pyfunc.PythonModel):
    """Per-document loss and perplexity of a DataFrame's ``text`` column."""

    def load_context(self, context):
        self.seq_len = int(common.meta(context)["seq_len"])
        self.program = common.program(context)

    def predict(self, context, model_input: pd.DataFrame, params=None):
        docs = [t.encode("utf-8", "surrogatepass") for t in common.texts(model_input)]
        return common.scores(*common.score_documents(self.program, docs, self.seq_len))


mlflow.models.set_model(TextScorer())
