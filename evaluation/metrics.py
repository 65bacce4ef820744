"""Metric code lives with the tasks (``tasks.metrics``); re-exported for callers of the old path."""

from tasks.metrics import (  # noqa: F401
    Predictor,
    classification_metrics,
    confusion_layout,
    confusion_png,
    latency_p95_ms,
    regression_metrics,
    torch_predictor,
)
