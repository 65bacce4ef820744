"""The tasks' metrics with numpy (no scikit-learn import), single-row latency, the confusion PNG."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

# One softmax for the evaluation and the registered models: a rescore gets the recorded bits.
from tasks.pyfunc_common import softmax  # noqa: F401

Predictor = Callable[[np.ndarray], np.ndarray]  # features [n, f] -> labels [n]


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> dict:
    """accuracy, balanced accuracy (the mean recall over the classes present), macro-F1, how many classes
    were predicted, per-class recall and the confusion matrix (rows: true, cols: predicted), as
    scikit-learn's ``recall_score`` / ``f1_score(average="macro", zero_division=0)`` define them
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
    seen = support > 0
    balanced = float(np.mean(recall[seen])) if seen.any() else 0.0
    return {"accuracy": float(np.mean(y_true == y_pred)), "balanced_accuracy": balanced,
            "macro_f1": float(np.mean(f1)), "predicted_classes": int((predicted > 0).sum()),
            "class_recall": {str(c): float(r) for c, r in enumerate(recall)}, "min_class_recall": float(recall.min()),
            "confusion_matrix": cm.tolist(), "n": int(len(y_true))}


# Threshold-free scores: what a user ranks classifiers by. ``average_precision`` of a binary task is the
# precision-recall AUC of its rarer class (in the scored split's truth; class 1 on a tie), the class
# such a table is usually about; of a multiclass task the macro mean one-vs-rest, as ROC AUC's.
LABEL_METRICS = ("accuracy", "balanced_accuracy", "macro_f1")
# Probabilities are clipped to [EPS, 1] in the log loss (scikit-learn's float64 eps).
EPS = float(np.finfo(np.float64).eps)


def _ranks(v: np.ndarray) -> np.ndarray:
    """1-based ranks of ``v``, ties sharing their mean rank (scipy's ``rankdata``)."""
    order = np.argsort(v, kind="mergesort")
    s = v[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    mean = (starts + ends + 1) / 2.0
    ranks = np.empty(len(v), dtype=np.float64)
    ranks[order] = np.repeat(mean, ends - starts)
    return ranks


def binary_roc_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC of ``score`` for the boolean truth ``positive`` (the Mann-Whitney statistic, ties
    counting one half); NaN when one side is empty."""
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = _ranks(np.asarray(score, dtype=np.float64))
    return float((r[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def binary_average_precision(positive: np.ndarray, score: np.ndarray) -> float:
    """Average precision (the step-wise precision-recall AUC) as scikit-learn's ``average_precision_score``
    defines it: sum over distinct score thresholds of (recall gained) x precision; NaN with no positive."""
    n_pos = int(positive.sum())
    if n_pos == 0:
        return float("nan")
    order = np.argsort(-np.asarray(score, dtype=np.float64), kind="mergesort")
    s, t = np.asarray(score, dtype=np.float64)[order], positive[order]
    last = np.r_[np.flatnonzero(s[1:] != s[:-1]), len(s) - 1]  # the last row of each tie group
    tp = np.cumsum(t)[last]
    precision = tp / (last + 1)
    recall = tp / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def ranking_metrics(y_true: np.ndarray, proba: np.ndarray) -> dict:
    """``roc_auc``, ``average_precision`` and ``log_loss`` of class probabilities ``proba`` [n, k]
    for the class indices ``y_true``. Binary: the scores of class 1; multiclass: the macro mean of each
    class against the rest over the classes present (scikit-learn's ``multi_class="ovr"``)."""
    y = np.asarray(y_true).astype(np.int64, copy=False).ravel()
    p = np.asarray(proba, dtype=np.float64)
    n, k = p.shape
    if n == 0:
        return {"roc_auc": float("nan"), "average_precision": float("nan"), "log_loss": float("nan")}
    norm = p / np.clip(p.sum(1, keepdims=True), EPS, None)  # for the log loss only: it moves ties
    inside = (y >= 0) & (y < k)
    picked = np.where(inside, norm[np.arange(n), np.clip(y, 0, k - 1)], 0.0)
    log_loss = float(-np.mean(np.log(np.clip(picked, EPS, 1.0))))
    if k == 2:
        pos = y == 1
        rare = 0 if int(pos.sum()) > n - int(pos.sum()) else 1
        return {"roc_auc": binary_roc_auc(pos, p[:, 1]),
                "average_precision": binary_average_precision(y == rare, p[:, rare]), "log_loss": log_loss}
    present = [c for c in range(k) if 0 < int((y == c).sum()) < n]
    auc = [binary_roc_auc(y == c, p[:, c]) for c in present]
    ap = [binary_average_precision(y == c, p[:, c]) for c in present]
    return {"roc_auc": float(np.mean(auc)) if auc else float("nan"),
            "average_precision": float(np.mean(ap)) if ap else float("nan"), "log_loss": log_loss}


def labels_of(proba: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """Class indices of probabilities [n, k]: the argmax, or for two classes with a ``threshold``,
    class 1 where its probability is at least the threshold."""
    p = np.asarray(proba, dtype=np.float64)
    if threshold is not None and p.shape[1] == 2:
        return (p[:, 1] >= threshold).astype(np.int64)
    return p.argmax(1).astype(np.int64)


def tune_threshold(y_true: np.ndarray, p1: np.ndarray, metric: str) -> tuple[float, float]:
    """``(threshold, value)``: the cut on class 1's probability ``p1`` (class 1 where ``p1 >= threshold``)
    that maximises ``metric`` (one of ``LABEL_METRICS``) on these rows, as scikit-learn's
    ``TunedThresholdClassifierCV`` does on a held-out split. Each distinct probability is tried; the cut
    lies halfway to the next lower one; of equal scores the cut nearest 0.5 wins (0.5 without rows)."""
    if metric not in LABEL_METRICS:
        raise ValueError(f"tune_threshold: {metric!r} is not one of {LABEL_METRICS}")
    y = np.asarray(y_true).astype(np.int64, copy=False).ravel() == 1
    p = np.asarray(p1, dtype=np.float64).ravel()
    if len(p) == 0:
        return 0.5, float("nan")
    values = np.unique(p)[::-1]  # descending: each is a cut, everything >= it predicted class 1
    lower = np.r_[values[1:], -np.inf]
    cuts = np.where(np.isfinite(lower), (values + lower) / 2, values)
    cuts = np.r_[cuts, np.nextafter(values[0], np.inf)]  # and the cut that predicts class 0 everywhere
    ps, ns = np.sort(p[y]), np.sort(p[~y])
    tp = len(ps) - np.searchsorted(ps, cuts, side="left")
    fp = len(ns) - np.searchsorted(ns, cuts, side="left")
    fn, tn = len(ps) - tp, len(ns) - fp
    n = len(p)
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "accuracy":
            score = (tp + tn) / n
        elif metric == "balanced_accuracy":
            parts = [tp / len(ps)] if len(ps) else []
            parts += [tn / len(ns)] if len(ns) else []
            score = np.mean(parts, axis=0)
        else:
            f1 = np.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0)
            f0 = np.where(2 * tn + fp + fn > 0, 2 * tn / (2 * tn + fp + fn), 0.0)
            score = (f1 + f0) / 2
    best = np.flatnonzero(score >= score.max() - 1e-12)
    pick = best[np.argmin(np.abs(cuts[best] - 0.5))]
    return float(cuts[pick]), float(score[pick])


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

def probability_scores(y_true: np.ndarray, proba: np.ndarray) -> dict:
    """balanced accuracy and macro-F1 of the argmax, and ``ranking_metrics`` (ROC AUC, average precision,
    log loss) of class probabilities ``proba`` [n, classes] against class indices ``y_true``: the same
    figures the evaluation reports, so early stopping follows the metric the gates judge by."""
    p = np.asarray(proba, dtype=np.float64)
    base = classification_metrics(y_true, p.argmax(1), p.shape[1])
    return {"balanced_accuracy": base["balanced_accuracy"], "macro_f1": base["macro_f1"],
            **ranking_metrics(y_true, p)}
