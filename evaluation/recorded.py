"""Reusing a registered version's own test scores instead of loading and rescoring it.

A version is tagged with the scores it was registered with (``eval_metrics``, JSON) and the task's
*scoring key* they hold for (``eval_key``: the evaluation split's bytes, the metric code's version,
the labels). A later run with an equal key takes the recorded figures; anything missing,
unparsable or different means: load and rescore. No MLflow here: the tags are a plain mapping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping


KEY_TAG = "eval_key"
METRICS_TAG = "eval_metrics"
SPLIT_TAG = "eval_split_sha256"
VERSION_TAG = "eval_metrics_version"


def record_tags(key: Mapping, metrics: Mapping, required: tuple[str, ...]) -> dict[str, str]:
    """Model-version tags recording ``metrics`` (latency left out) under ``key``; ``required``:
    ``task.recorded_keys()``."""
    kept = {k: v for k, v in metrics.items() if k != "latency_p95_ms"}
    missing = [k for k in required if k not in kept]
    if missing:
        raise ValueError(f"metrics to record lack {missing}")
    return {KEY_TAG: key["key"], SPLIT_TAG: key["split_sha256"], VERSION_TAG: str(key["metrics_version"]),
            METRICS_TAG: json.dumps(kept, separators=(",", ":"))}


def recorded_metrics(tags: Mapping[str, str] | None, key: Mapping, required: tuple[str, ...]) -> dict | None:
    """The version's recorded scores when they were measured under ``key``, else None (rescore)."""
    if not tags or tags.get(KEY_TAG) != key["key"] or METRICS_TAG not in tags:
        return None
    try:
        metrics = json.loads(tags[METRICS_TAG])
    except ValueError:  # e.g. cut by a tag length limit
        return None
    if not isinstance(metrics, dict) or any(k not in metrics for k in required):
        return None
    return metrics
