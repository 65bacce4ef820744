"""MLflow pyfunc wrapper around a table's ``torch.export`` program (models-from-code file).

MLflow copies this file into the logged model (with ``pyfunc_common``), so it imports no other
project code; it also runs it when the model is logged, so torch is imported only where the program
runs. The program maps float32
encoded rows to ``[batch, n_outputs]``; ``meta.json`` holds the feature columns with their kind
(categorical ones with their vocabulary) and ``output``: ``label`` (``class_labels`` in order) or
``value`` (a regression's, in the target's units), and a binary classifier's ``threshold`` (class 1
where its probability is at least that). ``predict`` takes the raw DataFrame a client has and
encodes it as ``tasks/encoding.py`` does (``tests/unit/test_table_encoding.py`` checks it); a
classifier returns labels, or with ``params={"predict_method": "predict_proba"}`` a DataFrame of
class probabilities, a column per class named by its label.
"""

import sys

import mlflow
import numpy as np
import pandas as pd

sys.modules.pop("pyfunc_common", None)  # this model's own copy: MLflow puts its code/ first on sys.path
import pyfunc_common as common  # noqa: E402


class ExportedTable(mlflow.pyfunc.PythonModel):
    """Predicts one class label, or one value, per row of a DataFrame of the feature columns."""

    def load_context(self, context):
        meta = common.meta(context)
        self.feature_columns = list(meta["feature_columns"])
        # Older models (before categorical columns) list only the names: every column numeric.
        self.columns = meta.get("columns") or [{"name": c, "kind": "numeric"} for c in self.feature_columns]
        codes = meta.get("codes") or {"missing": 0, "other": 1, "first": 2}
        self.codes = (codes["missing"], codes["other"], codes["first"])
        self.vocab = {c["name"]: pd.Index(c["values"], dtype=object) for c in self.columns
                      if c["kind"] == "categorical"}
        self.class_labels = common.labels(meta.get("class_labels"))
        self.threshold = meta.get("threshold")
        self.program = common.program(context)

    # The pd.DataFrame hint keeps MLflow from inferring a schema from type hints; arrays are accepted too.
    def predict(self, context, model_input: pd.DataFrame, params=None):
        method = common.method(params, ("predict",) if self.class_labels is None else ("predict", "predict_proba"))
        if isinstance(model_input, pd.DataFrame):
            missing = [c for c in self.feature_columns if c not in model_input.columns]
            if missing:
                raise ValueError(f"missing feature columns: {missing[:5]}")
            values = np.empty((len(model_input), len(self.columns)), dtype=np.float32)
            dates = {}  # a date column parsed once for all its parts
            for j, col in enumerate(self.columns):
                if "source" in col:
                    if col["source"] not in dates:
                        dates[col["source"]] = _date_parts(model_input[col["source"]], col["format"])
                    values[:, j] = dates[col["source"]][col["part"]]
                    continue
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
        if values.ndim != 2 or values.shape[1] != len(self.columns):
            raise ValueError(f"expected [rows, {len(self.columns)}] features, got {list(values.shape)}")
        if np.isinf(values).any():
            # NaN is a missing value: the program imputes it (its first layer).
            raise ValueError("features contain infinite values")
        if self.class_labels is None:  # a regression: the one output, in the target's units
            return common.forward(lambda x: self.program(x)[:, 0], values, rows=common.PROGRAM_ROWS)
        logits = common.forward(self.program, values, rows=common.PROGRAM_ROWS)
        return common.classes(logits, self.class_labels, method, self.threshold)

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


def _date_parts(s: pd.Series, fmt: str) -> dict:
    """A date column's parts as ``tasks.encoding.date_parts`` computes them: text parsed with ``fmt``
    (a value that does not parse counts as missing), calendar fields, hour, days since 1970-01-01."""
    t = s if pd.api.types.is_datetime64_any_dtype(s.dtype) else pd.to_datetime(s.astype("string"), format=fmt,
                                                                                errors="coerce")
    dt = t.dt
    out = {"year": dt.year, "month": dt.month, "day": dt.day, "weekday": dt.dayofweek, "dayofyear": dt.dayofyear,
           "hour": dt.hour}
    out = {k: v.to_numpy(dtype=np.float64, na_value=np.nan) for k, v in out.items()}
    out["days"] = (t - np.datetime64("1970-01-01")).dt.total_seconds().to_numpy(dtype=np.float64,
                                                                                  na_value=np.nan) / 86400
    out["missing"] = np.isnan(out["days"]).astype(np.float64)
    return out


def _text(v) -> str:
    """A category's text form: True/False, whole numbers without ".0", else str()."""
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    if isinstance(v, (float, np.floating)) and float(v).is_integer() and abs(v) < 2**53:
        return str(int(v))
    return str(v)


mlflow.models.set_model(ExportedTable())
