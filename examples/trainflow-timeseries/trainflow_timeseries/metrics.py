"""The example's own metrics of a one-step forecast, with numpy (torch-free): ``smape`` (percent,
0 perfect, 200 worst; scale-free) and ``directional_accuracy`` (share of rows moving the same way
from the last observed value as the truth; persistence scores 0).
"""

from __future__ import annotations

import numpy as np


def smape(y_true, y_pred) -> float:
    """``200/n * sum(|pred - true| / (|true| + |pred|))``, a row where both are 0 counting 0."""
    y_true = np.asarray(y_true, dtype=np.float64).ravel()
    y_pred = np.asarray(y_pred, dtype=np.float64).ravel()
    if not len(y_true):
        return 0.0
    denom = np.abs(y_true) + np.abs(y_pred)
    err = np.divide(np.abs(y_pred - y_true), denom, out=np.zeros_like(denom), where=denom > 0)
    return float(200.0 * err.mean())


def directional_accuracy(y_true, y_pred, last) -> float:
    """Share of rows with ``sign(pred - last) == sign(true - last)``."""
    y_true, y_pred, last = (np.asarray(a, dtype=np.float64).ravel() for a in (y_true, y_pred, last))
    if not len(y_true):
        return 0.0
    return float(np.mean(np.sign(y_pred - last) == np.sign(y_true - last)))


def forecast_metrics(y_true, y_pred, last) -> dict:
    """smape, directional_accuracy, rmse, mae and n of forecasts ``y_pred`` of ``y_true``, where
    ``last`` is each row's last observed value."""
    y_true = np.asarray(y_true, dtype=np.float64).ravel()
    err = np.asarray(y_pred, dtype=np.float64).ravel() - y_true
    return {"smape": smape(y_true, y_pred), "directional_accuracy": directional_accuracy(y_true, y_pred, last),
            "rmse": float(np.sqrt(np.mean(err ** 2))) if len(err) else 0.0,
            "mae": float(np.mean(np.abs(err))) if len(err) else 0.0, "n": int(len(y_true))}
