"""Reusing a registered version's own test scores instead of loading and rescoring it.

When a version is registered, the pipeline tags it with the scores it just measured
(``eval_metrics``, JSON) and with the *scoring key* they hold for (``eval_key``): a hash
of the evaluation split's bytes, the metric code's version and the labels the metrics are
taken over. A later run whose own scoring key is equal would compute exactly those
figures by loading the version and scoring it again, so it takes the recorded ones.
Anything missing, unparsable or different (an older champion, other test data, changed
metric code) means: load and rescore.

No MLflow here: the tags arrive as a plain mapping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from core.config import DatasetConfig
from core.hashing import file_sha256, sha256_json

# Bump when a metric's definition or computation changes (evaluation/metrics.py for the
# classifier, evaluation/lm.py for the language model): recorded scores then stop matching.
METRICS_VERSION = 1
LM_METRICS_VERSION = 1

KEY_TAG = "eval_key"
METRICS_TAG = "eval_metrics"
SPLIT_TAG = "eval_split_sha256"
VERSION_TAG = "eval_metrics_version"
# What a recorded dict must hold to stand in for a rescored champion.
REQUIRED = {"tabular": ("accuracy", "macro_f1", "min_class_recall", "class_recall", "confusion_matrix", "n"),
            "text": ("loss", "perplexity", "bits_per_byte", "n_tokens", "n_docs")}


def split_file(cfg: DatasetConfig, root: Path) -> Path:
    """The file the gate's scores are measured on: the test CSV, or the LM's eval documents."""
    name = cfg.text.eval_file if cfg.kind == "text" else cfg.test_file
    return Path(root) / cfg.path / name


def scoring_key(cfg: DatasetConfig, root: Path) -> dict:
    """``{"key", "split_sha256", "metrics_version"}`` of scoring on ``cfg``'s evaluation split now."""
    split = file_sha256(split_file(cfg, root))
    if cfg.kind == "text":
        version = LM_METRICS_VERSION
        parts = {"kind": "text", "split_sha256": split, "metrics_version": version}
    else:
        version = METRICS_VERSION
        parts = {"kind": "tabular", "split_sha256": split, "metrics_version": version,
                 "label_column": cfg.label_column, "n_classes": cfg.n_classes}
    return {"key": sha256_json(parts), "split_sha256": split, "metrics_version": version}


def record_tags(key: Mapping, metrics: Mapping, kind: str) -> dict[str, str]:
    """Model-version tags recording ``metrics`` (the candidate's, latency left out) under ``key``."""
    kept = {k: v for k, v in metrics.items() if k != "latency_p95_ms"}
    missing = [k for k in REQUIRED[kind] if k not in kept]
    if missing:
        raise ValueError(f"metrics to record lack {missing}")
    return {KEY_TAG: key["key"], SPLIT_TAG: key["split_sha256"], VERSION_TAG: str(key["metrics_version"]),
            METRICS_TAG: json.dumps(kept, separators=(",", ":"))}


def recorded_metrics(tags: Mapping[str, str] | None, key: Mapping, kind: str) -> dict | None:
    """The version's recorded scores when they were measured under ``key``, else None (rescore)."""
    if not tags or tags.get(KEY_TAG) != key["key"] or METRICS_TAG not in tags:
        return None
    try:
        metrics = json.loads(tags[METRICS_TAG])
    except ValueError:  # e.g. cut by a tag length limit
        return None
    if not isinstance(metrics, dict) or any(k not in metrics for k in REQUIRED[kind]):
        return None
    return metrics
