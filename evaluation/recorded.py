"""Reusing a registered version's own test scores instead of loading and rescoring it.

When a version is registered, the pipeline tags it with the scores it just measured
(``eval_metrics``, JSON) and with the *scoring key* they hold for (``eval_key``, the task's
``scoring_key``): a hash of the evaluation split's bytes, the metric code's version and the
labels the metrics are taken over. A later run whose own scoring key is equal would compute exactly those
figures by loading the version and scoring it again, so it takes the recorded ones.
Anything missing, unparsable or different (an older champion, other test data, changed
metric code) means: load and rescore.

No MLflow here: the tags arrive as a plain mapping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping


KEY_TAG = "eval_key"
METRICS_TAG = "eval_metrics"
SPLIT_TAG = "eval_split_sha256"
VERSION_TAG = "eval_metrics_version"


def record_tags(key: Mapping, metrics: Mapping, required: tuple[str, ...]) -> dict[str, str]:
    """Model-version tags recording ``metrics`` (the candidate's, latency left out) under ``key``.
    ``required``: what the task needs of a record (``task.recorded_keys()``)."""
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
