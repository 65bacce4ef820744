"""Scoring a predictor on the held-out split, and single-sample latency."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

Predictor = Callable[[np.ndarray], np.ndarray]  # features [n, f] -> labels [n]


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> dict:
    """accuracy, macro-F1, per-class recall and the confusion matrix (rows: true, cols: predicted)."""
    from sklearn.metrics import confusion_matrix, f1_score, recall_score

    labels = list(range(n_classes))
    recall = recall_score(y_true, y_pred, labels=labels, average=None, zero_division=0)
    return {
        "accuracy": float(np.mean(y_true == y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "class_recall": {str(c): float(r) for c, r in zip(labels, recall)},
        "min_class_recall": float(recall.min()),
        "confusion_matrix": confusion_matrix(y_true, y_pred, labels=labels).tolist(),
        "n": int(len(y_true)),
    }


def latency_p95_ms(predict: Predictor, x: np.ndarray, n: int = 200, warmup: int = 20) -> float:
    """p95 wall time of one-row predictions, in milliseconds, cycling through ``x``'s rows."""
    rows = [x[i % len(x)][None, :] for i in range(n + warmup)]
    times = []
    for i, row in enumerate(rows):
        t0 = time.perf_counter()
        predict(row)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1000)
    return float(np.percentile(times, 95))


def torch_predictor(module, threads: int = 1) -> Predictor:
    """Wrap a torch module (e.g. a loaded ``model.pt2``) as features -> labels on CPU."""
    import torch

    torch.set_num_threads(threads)

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.as_tensor(x, dtype=torch.float32)).argmax(1).numpy()

    return predict


def confusion_png(matrix: list[list[int]], path: Path, title: str) -> Path:
    """Render the confusion matrix as a PNG (headless matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = np.asarray(matrix)
    fig, ax = plt.subplots(figsize=(5, 4.5), dpi=100)
    ax.imshow(m, cmap="Blues")
    for (i, j), v in np.ndenumerate(m):
        ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                color="white" if v > m.max() / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_xticks(range(m.shape[1]))
    ax.set_yticks(range(m.shape[0]))
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
