"""The tasks' metrics with numpy (no scikit-learn import), single-row latency, the confusion PNG."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

Predictor = Callable[[np.ndarray], np.ndarray]  # features [n, f] -> labels [n]


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> dict:
    """accuracy, macro-F1, per-class recall and the confusion matrix (rows: true, cols: predicted),
    as scikit-learn's ``recall_score`` / ``f1_score(average="macro", zero_division=0)`` define them
    (without importing it). A label outside ``0..n_classes-1`` is ignored, as with ``labels=``."""
    y_true = np.asarray(y_true).astype(np.int64, copy=False).ravel()
    y_pred = np.asarray(y_pred).astype(np.int64, copy=False).ravel()
    inside = (y_true >= 0) & (y_true < n_classes) & (y_pred >= 0) & (y_pred < n_classes)
    cm = np.bincount(y_true[inside] * n_classes + y_pred[inside], minlength=n_classes * n_classes)
    cm = cm.reshape(n_classes, n_classes)
    tp = np.diag(cm).astype(np.float64)
    support, predicted = cm.sum(1).astype(np.float64), cm.sum(0).astype(np.float64)
    recall = np.divide(tp, support, out=np.zeros(n_classes), where=support > 0)
    denom = 2 * tp + (predicted - tp) + (support - tp)
    f1 = np.divide(2 * tp, denom, out=np.zeros(n_classes), where=denom > 0)
    return {"accuracy": float(np.mean(y_true == y_pred)), "macro_f1": float(np.mean(f1)),
            "class_recall": {str(c): float(r) for c, r in enumerate(recall)}, "min_class_recall": float(recall.min()),
            "confusion_matrix": cm.tolist(), "n": int(len(y_true))}


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict:
    """r2 (1 - SSE/SST; 0 when the targets are constant and predicted exactly), rmse, mae, n."""
    y_true = np.asarray(y_true, dtype=np.float64).ravel()
    y_pred = np.asarray(y_pred, dtype=np.float64).ravel()
    err = y_pred - y_true
    sse = float(np.sum(err ** 2))
    sst = float(np.sum((y_true - y_true.mean()) ** 2)) if len(y_true) else 0.0
    r2 = 1.0 - sse / sst if sst > 0 else (0.0 if sse > 0 else 1.0)
    return {"r2": r2, "rmse": float(np.sqrt(sse / max(len(y_true), 1))),
            "mae": float(np.mean(np.abs(err))) if len(err) else 0.0, "n": int(len(y_true))}


def timings_ms(predict: Callable, x, n: int = 200, warmup: int = 20) -> list[float]:
    """Wall times (ms) of ``n`` one-row calls of ``predict`` after ``warmup`` untimed ones, cycling
    through ``x``'s rows (a numpy array or a tensor)."""
    times = []
    for i in range(n + warmup):
        row = x[i % len(x)][None]
        t0 = time.perf_counter()
        predict(row)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1000)
    return times


def latency_p95_ms(predict: Predictor, x: np.ndarray, n: int = 200, warmup: int = 20) -> float:
    """p95 wall time of one-row predictions, in milliseconds, cycling through ``x``'s rows."""
    return float(np.percentile(timings_ms(predict, x, n, warmup), 95))


# Class names longer than this are cut on the confusion matrix's axes.
MAX_NAME = 14
# Cell colours run from light to dark blue with the count (matplotlib's "Blues" end points).
_LIGHT, _DARK = (247, 251, 255), (8, 48, 107)


def confusion_layout(n: int) -> tuple[int, int, int]:
    """``(cell, left, top)`` pixel sizes of an ``n`` x ``n`` matrix's picture."""
    cell = max(14, min(36, 480 // max(n, 1)))
    return cell, 56, 44


def confusion_png(matrix: list[list[int]], path: Path, title: str, names: list[str] | None = None) -> Path:
    """Render the confusion matrix as a PNG (rows true, columns predicted), the class names
    (``names``; else their indices, cut at ``MAX_NAME`` characters) on both axes. Drawn with Pillow:
    matplotlib's import alone would cost more than the drawing."""
    from PIL import Image, ImageDraw, ImageFont

    m = np.asarray(matrix, dtype=np.int64)
    n = m.shape[0]
    labels = [str(k) for k in range(n)] if names is None or len(names) != n else \
        [s if len(s) <= MAX_NAME else s[:MAX_NAME - 1] + "\u2026" for s in map(str, names)]
    cell, left, top = confusion_layout(n)
    font = ImageFont.load_default(size=max(8, min(12, cell // 3)))
    longest = max(int(font.getlength(s)) for s in labels)
    left = max(left, 12 + longest)
    bottom = 34 if longest <= cell else longest + 24
    width, height = left + n * cell + 12, top + n * cell + bottom
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    big = ImageFont.load_default(size=13)
    peak = max(int(m.max()), 1)
    light, dark = np.asarray(_LIGHT, float), np.asarray(_DARK, float)
    for (i, j), v in np.ndenumerate(m):
        x0, y0 = left + j * cell, top + i * cell
        colour = tuple(int(round(c)) for c in light + (dark - light) * (v / peak))
        draw.rectangle([x0, y0, x0 + cell - 1, y0 + cell - 1], fill=colour)
        if cell >= 18:
            draw.text((x0 + cell / 2, y0 + cell / 2), str(v), anchor="mm", font=font,
                      fill="white" if v > peak / 2 else "black")
    for k, label in enumerate(labels):
        if longest <= cell:
            draw.text((left + k * cell + cell / 2, top + n * cell + 3), label, anchor="ma", font=font, fill="black")
        else:  # a long name is turned upright under its column
            turned = Image.new("L", (int(font.getlength(label)) + 2, cell), 0)
            ImageDraw.Draw(turned).text((0, cell / 2), label, anchor="lm", font=font, fill=255)
            img.paste((0, 0, 0), (left + k * cell, top + n * cell + 3), turned.rotate(90, expand=True))
        draw.text((left - 4, top + k * cell + cell / 2), label, anchor="rm", font=font, fill="black")
    draw.text((left + n * cell / 2, height - 3), "predicted", anchor="md", font=font, fill="black")
    draw.text((4, top - 4), "true", anchor="ld", font=font, fill="black")
    draw.text((width / 2, 4), title, anchor="ma", font=big, fill="black")
    img.save(path, format="PNG")
    return path


# -- scores of class probabilities (per-epoch validation; training.early_stopping.metric) -----------

def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def binary_roc_auc(score: np.ndarray, positive: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic (tied scores share their average rank); nan when one
    side is empty. Equals scikit-learn's ``roc_auc_score``."""
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def binary_average_precision(score: np.ndarray, positive: np.ndarray) -> float:
    """Average precision, sum over thresholds of (R_n - R_{n-1}) P_n, as scikit-learn's
    ``average_precision_score`` defines it; nan with no positive."""
    positive = np.asarray(positive, dtype=bool)
    if not positive.any():
        return float("nan")
    order = np.argsort(-np.asarray(score, dtype=np.float64), kind="mergesort")
    s, hit = np.asarray(score, dtype=np.float64)[order], positive[order]
    last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # the last index of each distinct score
    tps = np.cumsum(hit)[last]
    precision, recall = tps / (last + 1), tps / positive.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def probability_scores(y_true: np.ndarray, proba: np.ndarray) -> dict:
    """balanced accuracy, macro-F1, ROC AUC and average precision (binary: of the second class;
    more classes: one-vs-rest, macro over the classes present) and log loss of class probabilities
    ``proba`` [n, classes] against class indices ``y_true``."""
    y = np.asarray(y_true).astype(np.int64, copy=False).ravel()
    p = np.asarray(proba, dtype=np.float64)
    k = p.shape[1]
    base = classification_metrics(y, p.argmax(1), k)
    support = np.bincount(y, minlength=k) > 0
    recall = np.array([base["class_recall"][str(c)] for c in range(k)])
    columns = [1] if k == 2 else [c for c in range(k) if support[c]]
    auc = [binary_roc_auc(p[:, c], y == c) for c in columns]
    ap = [binary_average_precision(p[:, c], y == c) for c in columns]
    picked = np.clip(p[np.arange(len(y)), y], 1e-15, 1.0)
    return {"balanced_accuracy": float(recall[support].mean()) if support.any() else 0.0,
            "macro_f1": base["macro_f1"], "roc_auc": float(np.nanmean(auc)) if auc else float("nan"),
            "average_precision": float(np.nanmean(ap)) if ap else float("nan"),
            "log_loss": float(-np.mean(np.log(picked))) if len(y) else float("nan")}
